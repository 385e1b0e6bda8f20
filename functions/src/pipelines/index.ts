import { pipelineRegistry } from '../core/pipeline';
import { canaryPipeline } from './canary';

/** Every pipeline the deployed functions accept, by name. */
export const pipelines = pipelineRegistry(canaryPipeline);
