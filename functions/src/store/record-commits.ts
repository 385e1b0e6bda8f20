/**
 * The job commit and the unit commit, as the store modules above them write through them (a
 * retention pass's stamping, a re-drive's set-aside): the writes of the next job or unit record
 * into a commit, with what keeps its claim slot, fan-out and timeline in step. JobStore implements
 * both; these modules take a handle with them, so they need not import JobStore.
 */
import type { DocumentSnapshot } from 'firebase-admin/firestore';
import type { JobRecord, UnitRecord } from '../core/job';
import type { TimelineEvent } from '../core/transitions';
import type { FirestoreHandle, JobVersion, JobWriter } from './firestore-handle';

export interface JobCommit {
  /** Adds the next job record (conditioned on `snapshot`'s update time) and its events to `tx`; returns the record as written. */
  commitJob(tx: JobWriter, snapshot: JobVersion, current: JobRecord, proposed: JobRecord, events: readonly TimelineEvent[]): JobRecord;
}

export interface UnitCommit {
  /** Adds the next unit record (conditioned on `snapshot`'s update time) and its claim slot to `tx`. */
  commitUnit(tx: JobWriter, snapshot: DocumentSnapshot, next: UnitRecord, current?: UnitRecord): void;
}

/** A handle that also commits job records. */
export type JobCommitHandle = FirestoreHandle & JobCommit;

/** A handle that also commits unit records. */
export type UnitCommitHandle = FirestoreHandle & UnitCommit;
