import type { Firestore } from 'firebase-admin/firestore';
import { firestore } from '../triggers/admin';

/**
 * The Firestore the deployed functions read and write (the default app's, or the one a test host
 * provided). Call it when a step runs, not at load: for a pipeline's own Firestore-backed
 * dependencies (an artifact store, a provider circuit).
 */
export function phaselineFirestore(): Firestore {
  return firestore();
}
