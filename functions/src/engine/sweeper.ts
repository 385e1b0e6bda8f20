/**
 * The sweeper: one bounded pass over index-backed queries that finds work nobody is doing and
 * hands it back.
 *
 *   1. expired job leases    -> requeue at step + 1 (staleReclaims + 1), or quarantine a poison job
 *   2. expired unit leases   -> the same on the unit; a poison unit quarantines its job
 *   3. lost tasks            -> a queued job or unit long past its run time gets a fresh dispatch
 *   4. provider waits over   -> back to queued at step + 1
 *   5. stopped jobs' effects -> checked with the system of record (its own module, settle-stopped.ts)
 *   6. ended jobs' retention -> transcripts, events and artifacts get `expireAt` (its own module, retention.ts)
 *
 * Each query returns only documents that need action (its cost grows with expired leases, not
 * with the number of jobs), `sweepBatchSize` at a time, paged by (range field, document ID) up to
 * SWEEP_MAX_PAGES pages. Every document found is decided again through the store's door
 * (JobStore.apply) from a fresh read, and committed conditioned on what was read: a heartbeat, a
 * claim or another sweeper may have moved it since the query, and then it is left alone. No lock is
 * taken, so a sweeper that dies mid-decision holds nobody up. The store enqueues a change's task only
 * after its commit; an enqueue that fails is logged and counted, and rule 3 dispatches the job again
 * one grace period later.
 *
 * "Now" is the caller's (the scheduler's time), never the wall clock: every decision uses `nowMs`.
 * Write timestamps (`updatedAt`, event times) come from the store's clock.
 */
import type { QueryDocumentSnapshot } from 'firebase-admin/firestore';
import { describeError, OwnershipLostError, UnreadableJobError } from '../core/errors';
import { TERMINAL_STATUSES, type JobRecord } from '../core/job';
import { currentFanOut, inFanOut, parkUnit, reclaimExpiredJob, reclaimExpiredUnit, redispatchJob as redispatchQueuedJob, redispatchUnit as redispatchQueuedUnit, resumeWaitJob, type Transition } from '../core/transitions';
import { decodeJob, decodeUnit, type UnitRecord } from '../store/codec';
import { quarantineViaUnit } from '../core/fan-out-moves';
import type { Change, SweptUnitCurrent } from '../store/door';
import type { JobStore } from '../store/job-store';
import { readSweepPage, type PageCursor, type SweepPage } from '../store/sweep-queries';
import type { TaskQueuePort } from '../store/task-queue';
import { endUnreadableJob } from '../store/unreadable-jobs';
import { SWEEP_QUERIES, type SweepQueryName } from './indexed-queries';
import { settleStoppedEffects, type SettleStoppedReport, type StoppedEffectsDeps } from './settle-stopped';
import { stampEndedJobs, type RetentionReport } from './retention';
import { forEachLimited } from './concurrency';
import { fanOutMoveChange } from './ended-fan-out';

/** Pages each query may read per run; with the default batch of 200, 1,000 documents per query. */
export const SWEEP_MAX_PAGES = 5;
/** Documents (or, for units, jobs) handled at once within a page. */
export const SWEEP_CONCURRENCY = 8;

export type SweepLog = (message: string, detail?: Record<string, unknown>) => void;

export interface SweepDeps {
  readonly store: JobStore;
  readonly queue: TaskQueuePort;
  /** Where warnings go (enqueue failures, unreadable documents). Defaults to console.warn. */
  readonly log?: SweepLog;
  /** The effect adapters that settle stopped jobs' effects (settle-stopped.ts); without them that pass is skipped. */
  readonly stoppedEffects?: StoppedEffectsDeps;
}

export interface SweepReport {
  readonly nowMs: number;
  /** Expired job leases requeued. */
  readonly reclaimed: number;
  /** Expired unit leases requeued. */
  readonly unitsReclaimed: number;
  /** Jobs quarantined because a job or unit lease expired once too often. */
  readonly quarantined: number;
  /** Queued jobs whose task went missing, dispatched again. */
  readonly redispatched: number;
  readonly unitsRedispatched: number;
  /** Provider waits that ran out, requeued. */
  readonly resumed: number;
  /** Units left over from a fan-out that ended (job finished, gone or moved on), taken out of the sweep. */
  readonly parkedUnits: number;
  /** Documents that changed between the query and the commit, left alone. */
  readonly skipped: number;
  readonly enqueued: number;
  readonly enqueueFailures: number;
  /** Queries or documents that failed (logged); the next run tries again. */
  readonly errors: number;
  readonly queryPages: number;
  /** Documents returned by queries. */
  readonly queryDocuments: number;
  /** Query documents plus documents read to decide (each attempt counted). */
  readonly documentsRead: number;
  /** Queries that stopped at SWEEP_MAX_PAGES with more to do: the next run continues. */
  readonly truncated: readonly SweepQueryName[];
  /** Stopped jobs' effects checked with their system of record (settle-stopped.ts, its own counters). */
  readonly stoppedEffects: SettleStoppedReport;
  /** Ended jobs' expiring documents stamped with `expireAt` (retention.ts, its own counters). */
  readonly retention: RetentionReport;
}

type Counter = Exclude<keyof SweepReport, 'nowMs' | 'truncated' | 'stoppedEffects' | 'retention'>;
type Action = 'reclaimed' | 'unitsReclaimed' | 'quarantined' | 'redispatched' | 'unitsRedispatched' | 'resumed' | 'parkedUnits';

/** What a commit decided (its task, if any, the store enqueues once it has committed). */
type Outcome =
  /** `unreadableJob`: the document's job could not be read; it is ended once this commit is in. */
  | { readonly counter: Action }
  | { readonly counter: 'parkedUnits'; readonly unreadableJob: UnreadableJobError }
  /** The document changed between the query and the commit (or is not for the sweeper after all). */
  | { readonly counter: 'skipped'; readonly reason: string };

class Sweep {
  private readonly counts: Record<Counter, number> = {
    reclaimed: 0,
    unitsReclaimed: 0,
    quarantined: 0,
    redispatched: 0,
    unitsRedispatched: 0,
    resumed: 0,
    parkedUnits: 0,
    skipped: 0,
    enqueued: 0,
    enqueueFailures: 0,
    errors: 0,
    queryPages: 0,
    queryDocuments: 0,
    documentsRead: 0,
  };
  private readonly truncated: SweepQueryName[] = [];
  /** The store, enqueueing the tasks of what this sweep commits through a queue that counts them. */
  readonly store: JobStore;
  private readonly log: SweepLog;

  constructor(
    deps: SweepDeps,
    readonly nowMs: number,
  ) {
    this.log = deps.log ?? ((message, detail) => console.warn(JSON.stringify({ severity: 'WARNING', message, ...detail })));
    const counts = this.counts;
    const counting: TaskQueuePort = {
      async enqueue(task, options) {
        try {
          await deps.queue.enqueue(task, options);
        } catch (error) {
          // The state change is durable; rule 3 dispatches the step again after the grace period.
          counts.enqueueFailures += 1;
          throw error;
        }
        counts.enqueued += 1;
      },
    };
    this.store = deps.store.dispatchingTo(counting, (message, detail) => this.log(`sweep: ${message}`, detail));
  }

  read(documents: number): void {
    this.counts.documentsRead += documents;
  }

  report(): Omit<SweepReport, 'stoppedEffects' | 'retention'> {
    return { nowMs: this.nowMs, ...this.counts, truncated: [...this.truncated] };
  }

  /**
   * Pages through one declared query. Documents are handled in groups (by `groupOf`): groups run
   * concurrently, the documents of one group one after another (units of one job share its document).
   */
  async scan(name: SweepQueryName, upToMs: number, handle: (doc: QueryDocumentSnapshot) => Promise<Outcome>, groupOf: (doc: QueryDocumentSnapshot) => string): Promise<void> {
    const batch = Math.max(1, Math.floor(this.store.options.sweepBatchSize));
    let cursor: PageCursor | null = null;
    for (let page = 0; page < SWEEP_MAX_PAGES; page += 1) {
      let found: SweepPage;
      try {
        found = await readSweepPage(this.store, SWEEP_QUERIES[name], upToMs, batch, cursor);
      } catch (error) {
        this.counts.errors += 1;
        this.log('sweep query failed', { query: name, error: describeError(error) });
        return;
      }
      const { docs } = found;
      this.counts.queryPages += 1;
      this.counts.queryDocuments += docs.length;
      this.read(docs.length);
      const groups = new Map<string, QueryDocumentSnapshot[]>();
      for (const doc of docs) {
        const key = groupOf(doc);
        groups.set(key, [...(groups.get(key) ?? []), doc]);
      }
      await forEachLimited([...groups.values()], SWEEP_CONCURRENCY, async (group) => {
        for (const doc of group) await this.settle(name, doc, handle);
      });
      if (!found.next) return;
      cursor = found.next;
    }
    this.truncated.push(name);
  }

  private async settle(name: SweepQueryName, doc: QueryDocumentSnapshot, handle: (doc: QueryDocumentSnapshot) => Promise<Outcome>): Promise<void> {
    let outcome: Outcome;
    try {
      outcome = await handle(doc);
    } catch (error) {
      if (error instanceof OwnershipLostError) {
        this.counts.skipped += 1;
        return;
      }
      if (error instanceof UnreadableJobError) {
        await this.endUnreadable(name, error);
        return;
      }
      this.counts.errors += 1;
      this.log('sweep could not handle a document', { query: name, path: doc.ref.path, error: describeError(error) });
      return;
    }
    this.counts[outcome.counter] += 1;
    if ('unreadableJob' in outcome) await this.endUnreadable(name, outcome.unreadableJob);
  }

  /** A job document the codec refuses would be found by every run: it is ended where it stands (store/unreadable-jobs.ts), once. */
  private async endUnreadable(name: SweepQueryName, error: UnreadableJobError): Promise<void> {
    try {
      const ending = await endUnreadableJob(this.store, error);
      this.counts[ending === 'quarantined' ? 'quarantined' : 'skipped'] += 1;
      this.log('sweep: a job document cannot be read; ended where it stands', { query: name, jobId: error.jobId, reason: error.message, ending });
    } catch (endError) {
      this.counts.errors += 1;
      this.log('sweep: a job document cannot be read, and ending it failed; the next run tries again', { query: name, jobId: error.jobId, error: describeError(endError) });
    }
  }
}

/** A recovery pass's report: the rules a lost worker or task waits on, without the slower passes'. */
export type RecoverySweepReport = Omit<SweepReport, 'stoppedEffects' | 'retention'>;

const byDocument = (doc: QueryDocumentSnapshot) => doc.ref.path;
const byJob = (doc: QueryDocumentSnapshot) => doc.ref.parent.parent?.path ?? doc.ref.path;

/** Rules 1 to 3: expired job and unit leases, lost job and unit tasks. */
async function recoverLostWork(run: Sweep, nowMs: number): Promise<void> {
  const lostBefore = nowMs - run.store.options.lostTaskGraceSeconds * 1000;
  await run.scan('expiredJobLeases', nowMs, (doc) => reclaimJobLease(run, doc), byDocument);
  await run.scan('expiredUnitLeases', nowMs, (doc) => reclaimUnitLease(run, doc), byJob);
  await run.scan('lostJobTasks', lostBefore, (doc) => redispatchJob(run, doc, lostBefore), byDocument);
  await run.scan('lostUnitTasks', lostBefore, (doc) => redispatchUnit(run, doc, lostBefore), byJob);
}

/**
 * Rules 1 to 3 alone at `nowMs`: what a lost worker or a lost task waits on, run several times a
 * minute between full sweeps (sweep-minute.ts). Four index-backed queries; never throws for one document.
 */
export async function sweepRecovery(deps: SweepDeps, nowMs: number): Promise<RecoverySweepReport> {
  const run = new Sweep(deps, nowMs);
  await recoverLostWork(run, nowMs);
  return run.report();
}

/** Rules 1 to 4 at `nowMs`: the recovery rules, then provider waits that are over. Index-backed queries only; never throws for one document. */
export async function sweepRules(deps: SweepDeps, nowMs: number): Promise<RecoverySweepReport> {
  const run = new Sweep(deps, nowMs);
  await recoverLostWork(run, nowMs);
  await run.scan('waitsOver', nowMs, (doc) => resumeWait(run, doc), byDocument);
  return run.report();
}

/** What the passes over stopped and ended jobs (rules 5 and 6) did. */
export type EndedJobsReport = Pick<SweepReport, 'stoppedEffects' | 'retention'>;

/**
 * Rules 5 and 6 at `nowMs`: stopped jobs' effects looked up at their systems of record, then ended
 * jobs' retention stamps. The slow part of a full sweep (a lookup waits on its target, up to the
 * adapter's deadline), so sweepMinute runs it beside the recovery passes, never in front of them;
 * with `untilMs` (on the store's clock) it starts no further stopped job's check past that time,
 * and the jobs left stay due for the next run. Never throws for a single job or query.
 */
export async function sweepEndedJobs(deps: SweepDeps, nowMs: number, bounds: { readonly untilMs?: number } = {}): Promise<EndedJobsReport> {
  // The store as a sweep logs through it (these passes dispatch no task, so none is counted).
  const { store } = new Sweep(deps, nowMs);
  const stoppedEffects = await settleStoppedEffects({ ...deps, store }, nowMs, bounds);
  // Last: the lookups above may end jobs' stories (their events are stamped as they are written).
  const retention = await stampEndedJobs({ ...deps, store }, nowMs);
  return { stoppedEffects, retention };
}

/** Runs one sweep at `nowMs`, every rule in turn (sweepMinute runs the same rules on a minute's timeline). Never throws for a single document, query or enqueue: see the report. */
export async function sweep(deps: SweepDeps, nowMs: number): Promise<SweepReport> {
  const rules = await sweepRules(deps, nowMs);
  return { ...rules, ...(await sweepEndedJobs(deps, nowMs)) };
}


// ---- Rule 1: expired job leases ----------------------------------------------------------------

async function reclaimJobLease(run: Sweep, doc: QueryDocumentSnapshot): Promise<Outcome> {
  const { store, nowMs } = run;
  const seen = decodeJob(doc.id, doc.data()).lease;
  if (!seen) throw new OwnershipLostError('the job has no lease');
  return store.apply({ kind: 'job-record', jobId: doc.id }, ({ job }) => {
    run.read(1);
    if (job.lease?.epoch !== seen.epoch) throw new OwnershipLostError('the lease changed hands since the query');
    return committed(reclaimExpiredJob(job, store.options, nowMs), 'reclaimed');
  });
}

/** The transition as a change: its record, events and task; quarantine is counted as such. */
function committed(transition: Transition<JobRecord>, counter: Action): Change<Outcome> {
  const action: Action = transition.next.status === 'quarantined' ? 'quarantined' : counter;
  return { next: transition.next, events: transition.events, dispatch: transition.dispatch, value: { counter: action } };
}

// ---- Units: decided from the job and one unit -------------------------------------------------

/** What a unit rule decides from its fresh read, once the unit is still the one the query found. */
type UnitRule = (context: { readonly job: JobRecord; readonly unit: UnitRecord }) => Change<Outcome> | Promise<Change<Outcome>>;

/**
 * Decides one unit the query found through the door (`swept-unit`): `stillDue` says whether the unit
 * as read now is still the one the query found; a unit of a fan-out that can never resume is parked;
 * one whose job is not in its fan-out is left alone; the rest is `rule`'s.
 */
function inSweptUnit(run: Sweep, seen: UnitRecord, stillDue: (unit: UnitRecord) => string | null, rule: UnitRule): Promise<Outcome> {
  const keys = { jobId: seen.jobId, phase: seen.phase, unit: seen.unit };
  return run.store.apply({ kind: 'swept-unit', keys }, (current: SweptUnitCurrent): Change<Outcome> | Promise<Change<Outcome>> => {
    const { job, unit } = current;
    run.read(job === null ? 2 : 3);
    // Its job can run nothing: the unit leaves the sweep here, and the job is ended once this commits.
    if (current.unreadable) return { nextUnit: parkUnit(unit, { why: "its job's document cannot be read" }, run.nowMs).next, value: { counter: 'parkedUnits', unreadableJob: current.unreadable } };
    const changed = stillDue(unit);
    if (changed !== null) return skipped(changed);
    if (fanOutEnded(job, unit)) return park(job, unit, run.nowMs);
    if (job === null || !inFanOut(job, unit)) return skipped(`the job is ${job?.status ?? 'gone'}, not in this unit's fan-out`);
    return rule({ job, unit });
  });
}

/** Nothing written: the unit is not the sweeper's after all. */
function skipped(reason: string): Change<Outcome> {
  return { value: { counter: 'skipped', reason } };
}

/**
 * A unit whose fan-out can never resume: its job is gone or finished, or has been claimed again
 * (a later epoch) without being in this unit's fan-out. Left as it is, such a unit would match the
 * sweep queries on every run, and enough of them would crowd out live work.
 */
function fanOutEnded(job: JobRecord | null, unit: UnitRecord): boolean {
  if (job === null || TERMINAL_STATUSES.has(job.status)) return true;
  return job.epoch > unit.fanoutEpoch && currentFanOut(job)?.epoch !== unit.fanoutEpoch;
}

/** Parks a leftover unit: no lease, not queued, so no query matches it; the reason is on the unit. */
function park(job: JobRecord | null, unit: UnitRecord, nowMs: number): Change<Outcome> {
  const why = job === null ? 'its job no longer exists' : TERMINAL_STATUSES.has(job.status) ? `its job is ${job.status}` : `its job left fan-out epoch ${unit.fanoutEpoch}`;
  return { nextUnit: parkUnit(unit, { why }, nowMs).next, value: { counter: 'parkedUnits' } };
}

// ---- Rule 2: expired unit leases ---------------------------------------------------------------

async function reclaimUnitLease(run: Sweep, doc: QueryDocumentSnapshot): Promise<Outcome> {
  const { store, nowMs } = run;
  const seen = decodeUnit(doc.ref.path, doc.data());
  const seenLease = seen.lease;
  if (!seenLease) throw new OwnershipLostError('the unit has no lease');
  const stillDue = (unit: UnitRecord): string | null => {
    if (unit.status !== 'running' || unit.lease?.epoch !== seenLease.epoch) return 'the unit changed since the query';
    if (unit.lease.expiresAtMs > nowMs) return 'the lease was extended since the query';
    return null;
  };
  return inSweptUnit(run, seen, stillDue, async ({ job, unit }) => {
    // The budget is the unit's own; the rule is the same as for a job.
    const reclaimed = reclaimExpiredUnit(unit, store.options, nowMs);
    if (reclaimed.quarantine !== undefined) {
      const { quarantine } = reclaimed;
      // The fan-out's other units are read now; those the quarantine charges are rewritten conditioned on this read.
      const moved = await fanOutMoveChange(store, job, (others) => {
        run.read(others.length);
        return quarantineViaUnit(job, { ...reclaimed, quarantine }, others, nowMs);
      });
      return { ...moved, value: { counter: 'quarantined' } };
    }
    // The job is rewritten as read: its timeline gets the event, and its precondition fences the unit's commit.
    return { next: job, nextUnit: reclaimed.next, events: reclaimed.events, dispatch: reclaimed.dispatch, value: { counter: 'unitsReclaimed' } };
  });
}

// ---- Rule 3: lost tasks ------------------------------------------------------------------------

async function redispatchJob(run: Sweep, doc: QueryDocumentSnapshot, lostBefore: number): Promise<Outcome> {
  const { store, nowMs } = run;
  const seen = decodeJob(doc.id, doc.data());
  return store.apply({ kind: 'job-record', jobId: doc.id }, ({ job }) => {
    run.read(1);
    if (job.status === 'queued' && (job.step !== seen.step || job.dispatch !== seen.dispatch)) throw new OwnershipLostError('the job was dispatched again since the query');
    return committed(redispatchQueuedJob(job, { lostBeforeMs: lostBefore }, nowMs), 'redispatched');
  });
}

async function redispatchUnit(run: Sweep, doc: QueryDocumentSnapshot, lostBefore: number): Promise<Outcome> {
  const { nowMs } = run;
  const seen = decodeUnit(doc.ref.path, doc.data());
  const stillDue = (unit: UnitRecord): string | null => {
    if (unit.status !== 'queued' || unit.step !== seen.step || unit.dispatch !== seen.dispatch || unit.fanoutEpoch !== seen.fanoutEpoch) return 'the unit changed since the query';
    if (unit.nextRunAtMs > lostBefore) return 'the unit is not overdue any more';
    return null;
  };
  return inSweptUnit(run, seen, stillDue, ({ job, unit }) => {
    const redispatched = redispatchQueuedUnit(unit, { lostBeforeMs: lostBefore }, nowMs);
    return { next: job, nextUnit: redispatched.next, events: redispatched.events, dispatch: redispatched.dispatch, value: { counter: 'unitsRedispatched' } };
  });
}

// ---- Rule 4: provider waits that are over ------------------------------------------------------

async function resumeWait(run: Sweep, doc: QueryDocumentSnapshot): Promise<Outcome> {
  const { store, nowMs } = run;
  return store.apply({ kind: 'job-record', jobId: doc.id }, ({ job }) => {
    run.read(1);
    return committed(resumeWaitJob(job, nowMs), 'resumed');
  });
}
