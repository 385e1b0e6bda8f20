/**
 * The reads of a job's semantic state: its phase checkpoints, the sections a phase recorded and the
 * units of a fan-out. Raw documents only; engine/checkpoints.ts validates them against the pipeline.
 */
import type { QueryDocumentSnapshot } from 'firebase-admin/firestore';
import type { JobStore } from './job-store';
import { JOBS, unitsPath } from './paths';

export interface StoredDocument {
  readonly id: string;
  readonly data: unknown;
}

/** Every checkpoint document of a job (one per phase), as stored. */
export async function readCheckpointDocuments(store: JobStore, jobId: string): Promise<StoredDocument[]> {
  const snapshot = await store.db.collection(`${JOBS}/${jobId}/checkpoints`).get();
  return snapshot.docs.map((doc) => ({ id: doc.id, data: doc.data() }));
}

/** The section documents of one phase (all its units), as stored. One equality filter: no composite index needed. */
export async function readSectionDocuments(store: JobStore, jobId: string, phase: string): Promise<StoredDocument[]> {
  const snapshot = await store.db.collection(`${JOBS}/${jobId}/sections`).where('phase', '==', phase).get();
  return snapshot.docs.map((doc) => ({ id: doc.id, data: doc.data() }));
}

/** The unit documents of one fan-out epoch of a job (read outside any transaction). */
export async function readFanOutUnits(store: JobStore, jobId: string, fanoutEpoch: number): Promise<QueryDocumentSnapshot[]> {
  return (await store.db.collection(unitsPath(jobId)).where('fanoutEpoch', '==', fanoutEpoch).get()).docs;
}
