/**
 * The sweeper's retention pass: an ended job's transcripts, events and artifacts get `expireAt`
 * (when the job ended plus `retentionDays`), and Firestore's TTL policies delete them after that
 * (store/retention.ts says which collections; the job document and its answer stay).
 *
 * Stamping hundreds of documents cannot be part of the commit that ends a job, so that commit
 * leaves `retention: { dueAt, cursor }` on the job (core/lifecycle.ts, withRetentionDue). This pass
 * finds such jobs by one index-backed query per ended status (indexed-queries.ts; quarantined and
 * waiting jobs have not ended and never match), oldest first, and pages through each one's expiring
 * subcollections in document-ID order, one batch of stamps per page. Each batch also records the
 * cursor after its page on the job, conditioned on the job's update time as the pass found it (read
 * when it began, then as its own last batch left it): a job written meanwhile (a re-drive, which
 * runs it again) fails the batch, so no stamp lands after the job changed, and the pass leaves it
 * for the next sweep, where a job that still has its marker is looked at again (a re-driven one has
 * none, and the re-drive took off what earlier pages stamped). When a job is done its marker is
 * cleared; when the pass runs out of budget first, the job keeps the marker with a cursor and the
 * next sweep goes on from there, both in the last page's batch or a commit of their own, likewise
 * conditioned.
 *
 * Idempotent and resumable: a document already carrying the right `expireAt` is not written again,
 * and a sweep that dies midway leaves the marker (and the cursor its last page saved) in place.
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
import type { RetentionStamping } from '../core/job';
import { MAX_STAMPS_PER_BATCH, parseStampingCursor, readStampingJob, saveStamping, stampingAt, stampPage, type StampingJob, type StampingPosition } from '../store/retention';
import type { PageCursor } from '../store/sweep-queries';
import type { SweepQueryName } from './indexed-queries';
import { readPassPage } from './sweep-pages';

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
    let current: StampingJob = stamping;
    let position: StampingPosition | null = parseStampingCursor(retention.cursor);
    while (position !== null && budget > 0) {
      const page = await stampPage(store, current, position, Math.min(pageSize, budget), expireAt);
      budget -= Math.max(1, page.read);
      counts.documentsRead += page.read;
      counts.documentsStamped += page.stamped;
      if (page.job === null) {
        // Changed since the pass read it (a re-drive runs it again): nothing more is stamped; a job that is still due is looked at next sweep.
        counts.jobsDeferred += 1;
        return;
      }
      current = page.job;
      position = page.next;
    }
    const marker = stampingAt(retention.dueAtMs, position);
    // The last page's commit may have recorded exactly this already.
    const saved = sameStamping(current.job.retention ?? null, marker) || (await saveStamping(store, current, marker));
    counts[!saved ? 'jobsDeferred' : position === null ? 'jobsStamped' : 'jobsContinued'] += 1;
  };

  for (const name of RETENTION_QUERIES) {
    let cursor: PageCursor | null = null;
    do {
      if (budget <= 0) return { ...counts, budgetSpent: true };
      const found = await readPassPage(store, name, endedBeforeMs, pageSize, cursor, { counts, log, message: 'retention: query failed' });
      if (found === null) break;
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

function sameStamping(a: RetentionStamping | null, b: RetentionStamping | null): boolean {
  return a === null || b === null ? a === b : a.dueAtMs === b.dueAtMs && a.cursor === b.cursor;
}
