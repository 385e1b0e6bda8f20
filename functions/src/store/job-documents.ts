/**
 * References to the documents a claim holder writes besides its job and unit records (sections,
 * transcripts, the published answer), and the record of a rejected task, so the engine names them
 * without reaching for the Firestore instance.
 */
import { Timestamp, type DocumentReference } from 'firebase-admin/firestore';
import type { JobRecord } from '../core/job';
import { expireAtMs } from '../core/lifecycle';
import { EXPIRE_AT } from './retention';
import type { FirestoreHandle } from './firestore-handle';
import { messagePath, REJECTED_TASKS, resultPath, sectionKey, sectionPath, transcriptPath } from './paths';

export function sectionRef(store: FirestoreHandle, jobId: string, phase: string, unit: string | null, sectionId: string): DocumentReference {
  return store.db.doc(sectionPath(jobId, sectionKey(phase, unit, sectionId)));
}

/** One save of a section's transcript log (store/transcript-log.ts): the section's key and the save's number. */
export function transcriptSaveRef(store: FirestoreHandle, jobId: string, phase: string, unit: string | null, sectionId: string, save: number): DocumentReference {
  return store.db.doc(transcriptPath(jobId, `${sectionKey(phase, unit, sectionId)}~${String(save).padStart(6, '0')}`));
}

/** Where a job's answer is published: its conversation's message, or `jobs/{id}/results/final`. The ID is the job's own. */
export function outboxRef(store: FirestoreHandle, job: Pick<JobRecord, 'id' | 'conversationId'>): DocumentReference {
  return store.db.doc(job.conversationId ? messagePath(job.conversationId, job.id) : resultPath(job.id));
}

/** Whether a document a holder is about to create is there already, read plainly (its commit creates it, so one that appears meanwhile fails it). */
export async function documentExists(ref: DocumentReference): Promise<boolean> {
  return (await ref.get()).exists;
}

/** Whether the job's answer is already there, read plainly (the publishing commit is conditioned on the job). */
export async function outboxPublished(store: FirestoreHandle, job: Pick<JobRecord, 'id' | 'conversationId'>): Promise<boolean> {
  return documentExists(outboxRef(store, job));
}

export interface RejectedTask {
  readonly payload: string;
  readonly reason: string;
  readonly atMs: number;
}

/**
 * Records a task payload that could not be understood, for a person (`rejectedTasks`). It belongs
 * to no job, so it expires `retentionDays` after it was recorded (the TTL policy on `expireAt`).
 */
export async function addRejectedTask(store: FirestoreHandle, rejected: RejectedTask): Promise<void> {
  const expireAt = Timestamp.fromMillis(expireAtMs(rejected.atMs, store.options.retentionDays));
  await store.db.collection(REJECTED_TASKS).add({ payload: rejected.payload, reason: rejected.reason, atMs: rejected.atMs, [EXPIRE_AT]: expireAt });
}
