/**
 * The sweeper's retention pass: an ended job's transcripts, events and artifacts get `expireAt`
 * (when the job ended plus `retentionDays`), and Firestore's TTL policies delete them after that
 * (store/retention.ts says which collections; the job document and its answer stay).
 *
 * Stamping hundreds of documents cannot be part of the commit that ends a job, so that commit
 * leaves `retention: { dueAt, cursor }` on the job (core/lifecycle.ts, withRetentionDue). This pass
 * finds such jobs by one index-backed query per ended status (indexed-queries.ts; quarantined and
 * waiting jobs have not ended and never match), oldest first, and pages through each one's expiring
 * subcollections in document-ID order, one batch of stamps per page. When a job is done its marker
 * is cleared; when the pass runs out of budget first, the job keeps the marker with a cursor and the
 * next sweep goes on from there. Both are one commit conditioned on the job's update time as read
 * when its pass began: a job changed meanwhile keeps its marker and is looked at again next sweep.
 *
 * Idempotent and resumable: a document already carrying the right `expireAt` is not written again,
 * and a sweep that dies midway leaves the marker (and the last saved cursor) in place.
 *
 * Bounded: at most RETENTION_MAX_PAGES × `sweepBatchSize` documents read per sweep (1,000 with the
 * defaults), an empty page counting as one, so a huge job is spread over several sweeps and cannot
 * stall the others for long (they follow it in end-time order).
 *
 * Documents written to an ended job after its pass: its events are stamped as they are written
 * (JobStore.commitJob); transcripts and unit events are written only by a claim holder whose claim
 * the ending commit revoked, so none can land. Artifact puts are not fenced by the claim: a worker
 * that has not heard of the ending may still write one, so a job is stamped only RETENTION_GRACE_MS
 * after it ended, when such a worker's request has timed out.
 */
import { describeError } from '../core/errors';
import { ENDED_STATUSES } from '../core/job';
import { endedAtMs, expireAtMs } from '../core/lifecycle';
import type { JobStore } from '../store/job-store';
import { EXPIRING_JOB_COLLECTIONS, MAX_STAMPS_PER_BATCH, parseStampingCursor, readStampingJob, saveStamping, stampingCursor, stampPage, type StampingPosition } from '../store/retention';
import { readSweepPage, type PageCursor, type SweepPage } from '../store/sweep-queries';
import { SWEEP_QUERIES, type SweepQueryName } from './indexed-queries';

export const RETENTION_QUERIES: readonly SweepQueryName[] = ['completedRetentionDue', 'failedRetentionDue', 'cancelledRetentionDue'];
/**
 * A job is stamped only this long after it ended: longer than a step function may run (540 s), so
 * the writes of a worker that had not yet heard of the ending (a blind artifact put) have landed.
 */
export const RETENTION_GRACE_MS = 15 * 60_000;
/** Pages of `sweepBatchSize` expiring documents one sweep may read, across all jobs. */
export const RETENTION_MAX_PAGES = 5;

export interface RetentionReport {
  /** Jobs whose every expiring document now carries `expireAt`: their marker was cleared. */
  readonly jobsStamped: number;
  /** Jobs the budget ran out in: their cursor was saved and the next sweep goes on. */
  readonly jobsContinued: number;
  /** Jobs that changed while they were stamped: their marker stays and the next sweep looks again. */
  readonly jobsDeferred: number;
  /** Jobs found by the query that were not due after all (changed since, or gone). */
  readonly skipped: number;
  readonly documentsRead: number;
  readonly documentsStamped: number;
  /** Jobs or queries that failed (logged); their marker stays, so a later sweep finishes them. */
  readonly errors: number;
  readonly queryPages: number;
  /** The pass stopped with its budget spent; jobs still due wait for the next sweep. */
  readonly budgetSpent: boolean;
}

type Log = (message: string, detail?: Record<string, unknown>) => void;
type Counter = Exclude<keyof RetentionReport, 'budgetSpent'>;

/** One pass at `nowMs`. Never throws for a single job or query: see the report. */
export async function stampEndedJobs(deps: { readonly store: JobStore; readonly log?: Log }, nowMs: number): Promise<RetentionReport> {
  const { store } = deps;
  const log: Log = deps.log ?? ((message, detail) => console.warn(JSON.stringify({ severity: 'WARNING', message, ...detail })));
  const counts: Record<Counter, number> = { jobsStamped: 0, jobsContinued: 0, jobsDeferred: 0, skipped: 0, documentsRead: 0, documentsStamped: 0, errors: 0, queryPages: 0 };
  const pageSize = Math.max(1, Math.min(MAX_STAMPS_PER_BATCH, Math.floor(store.options.sweepBatchSize)));
  let budget = RETENTION_MAX_PAGES * pageSize;
  const endedBeforeMs = nowMs - RETENTION_GRACE_MS;

  /** Stamps one job as far as the budget goes. */
  const stampJob = async (jobId: string): Promise<void> => {
    const stamping = await readStampingJob(store, jobId);
    const retention = stamping?.job.retention;
    if (!stamping || !retention || !ENDED_STATUSES.has(stamping.job.status) || retention.dueAtMs > endedBeforeMs) {
      counts.skipped += 1;
      return;
    }
    const expireAt = expireAtMs(endedAtMs(stamping.job), store.options.retentionDays);
    let position: StampingPosition | null = parseStampingCursor(retention.cursor);
    while (position !== null && budget > 0) {
      const page = await stampPage(store, jobId, position, Math.min(pageSize, budget), expireAt);
      budget -= Math.max(1, page.read);
      counts.documentsRead += page.read;
      counts.documentsStamped += page.stamped;
      position = page.lastId !== null ? { collection: position.collection, afterId: page.lastId } : nextCollection(position);
    }
    const saved = await saveStamping(store, stamping, position === null ? null : { dueAtMs: retention.dueAtMs, cursor: stampingCursor(position) });
    counts[!saved ? 'jobsDeferred' : position === null ? 'jobsStamped' : 'jobsContinued'] += 1;
  };

  for (const name of RETENTION_QUERIES) {
    let cursor: PageCursor | null = null;
    do {
      if (budget <= 0) return { ...counts, budgetSpent: true };
      let found: SweepPage;
      try {
        found = await readSweepPage(store, SWEEP_QUERIES[name], endedBeforeMs, pageSize, cursor);
      } catch (error) {
        counts.errors += 1;
        log('retention: query failed', { query: name, error: describeError(error) });
        break;
      }
      counts.queryPages += 1;
      for (const doc of found.docs) {
        if (budget <= 0) return { ...counts, budgetSpent: true };
        try {
          await stampJob(doc.id);
        } catch (error) {
          // The marker stays: a later sweep starts again from the last saved cursor.
          counts.errors += 1;
          log('retention: stamping a job failed', { query: name, jobId: doc.id, error: describeError(error) });
        }
      }
      cursor = found.next;
    } while (cursor !== null);
  }
  return { ...counts, budgetSpent: false };
}

/** The start of the collection after this one, or null when the job is done. */
function nextCollection(position: StampingPosition): StampingPosition | null {
  const next = EXPIRING_JOB_COLLECTIONS[EXPIRING_JOB_COLLECTIONS.indexOf(position.collection) + 1];
  return next === undefined ? null : { collection: next, afterId: null };
}
