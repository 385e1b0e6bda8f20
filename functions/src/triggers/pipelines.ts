/** The deployed pipelines, shared by the triggers and reading Firestore through their backends. */
import { deployedPipelines } from '../pipelines';
import { firestore } from './admin';

export const pipelines = deployedPipelines(firestore);
