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
 * SWEEP_MAX_PAGES pages. Every document found is re-checked inside its own transaction: a heartbeat,
 * a claim or another sweeper may have moved it since the query, and then it is left alone. Tasks are
 * enqueued only after the transaction commits; an enqueue that fails is logged and counted, and
 * rule 3 dispatches the job again one grace period later.
 *
 * "Now" is the caller's (the scheduler's time), never the wall clock: every decision uses `nowMs`.
 * Write timestamps (`updatedAt`, event times) come from the store's clock.
 */
import type { DocumentSnapshot, QueryDocumentSnapshot, Transaction } from 'firebase-admin/firestore';
import { describeError, OwnershipLostError, UnreadableJobError } from '../core/errors';
import { TERMINAL_STATUSES, type JobRecord, type StepTask } from '../core/job';
import { currentFanOut, inFanOut, parkUnit, quarantineJobForUnit, reclaimExpiredJob, reclaimExpiredUnit, redispatchJob as redispatchQueuedJob, redispatchUnit as redispatchQueuedUnit, resumeWaitJob, type Transition } from '../core/transitions';
import { decodeJob, decodeUnit, type UnitRecord } from '../store/codec';
import type { EventDraft, JobStore } from '../store/job-store';
import { readSweepPage, type PageCursor, type SweepPage } from '../store/sweep-queries';
import type { TaskQueuePort } from '../store/task-queue';
import { endUnreadableJob } from '../store/unreadable-jobs';
import { endFanOutFromUnit } from './ended-fan-out';
import { SWEEP_QUERIES, type SweepQueryName } from './indexed-queries';
import { settleStoppedEffects, type SettleStoppedReport, type StoppedEffectsDeps } from './settle-stopped';
import { stampEndedJobs, type RetentionReport } from './retention';
import { forEachLimited } from './concurrency';

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
  /** Documents that changed between the query and the transaction, left alone. */
  readonly skipped: number;
  readonly enqueued: number;
  readonly enqueueFailures: number;
  /** Queries or documents that failed (logged); the next run tries again. */
  readonly errors: number;
  readonly queryPages: number;
  /** Documents returned by queries. */
  readonly queryDocuments: number;
  /** Query documents plus documents read inside transactions (each attempt counted). */
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

/** What a transaction decided, and the task to enqueue once it has committed. */
type Outcome =
  /** `unreadableJob`: the document's job could not be read; it is ended once this commit is in. */
  | { readonly counter: Action; readonly enqueue?: { readonly task: StepTask; readonly id: string }; readonly unreadableJob?: UnreadableJobError }
  /** The document changed between the query and the transaction (or is not for the sweeper after all). */
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
  readonly store: JobStore;
  private readonly log: SweepLog;

  constructor(
    private readonly deps: SweepDeps,
    readonly nowMs: number,
  ) {
    this.store = deps.store;
    this.log = deps.log ?? ((message, detail) => console.warn(JSON.stringify({ severity: 'WARNING', message, ...detail })));
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
    if ('enqueue' in outcome) await this.enqueue(outcome.enqueue.task, outcome.enqueue.id);
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

  private async enqueue(task: StepTask, id: string): Promise<void> {
    try {
      await this.deps.queue.enqueue(task, { id });
      this.counts.enqueued += 1;
    } catch (error) {
      // The state change is durable; rule 3 dispatches the step again after the grace period.
      this.counts.enqueueFailures += 1;
      this.log('sweep: enqueue failed; the next sweeps re-dispatch it', { task, id, error: describeError(error) });
    }
  }
}

/** Runs one sweep at `nowMs`. Never throws for a single document, query or enqueue: see the report. */
export async function sweep(deps: SweepDeps, nowMs: number): Promise<SweepReport> {
  const run = new Sweep(deps, nowMs);
  const byDocument = (doc: QueryDocumentSnapshot) => doc.ref.path;
  const byJob = (doc: QueryDocumentSnapshot) => doc.ref.parent.parent?.path ?? doc.ref.path;
  const lostBefore = nowMs - deps.store.options.lostTaskGraceSeconds * 1000;

  await run.scan('expiredJobLeases', nowMs, (doc) => reclaimJobLease(run, doc), byDocument);
  await run.scan('expiredUnitLeases', nowMs, (doc) => reclaimUnitLease(run, doc), byJob);
  await run.scan('lostJobTasks', lostBefore, (doc) => redispatchJob(run, doc, lostBefore), byDocument);
  await run.scan('lostUnitTasks', lostBefore, (doc) => redispatchUnit(run, doc, lostBefore), byJob);
  await run.scan('waitsOver', nowMs, (doc) => resumeWait(run, doc), byDocument);
  const stoppedEffects = await settleStoppedEffects(deps, nowMs);
  // Last: the passes above may end jobs' stories (their events are stamped as they are written).
  const retention = await stampEndedJobs(deps, nowMs);
  return { ...run.report(), stoppedEffects, retention };
}


// ---- Rule 1: expired job leases ----------------------------------------------------------------

async function reclaimJobLease(run: Sweep, doc: QueryDocumentSnapshot): Promise<Outcome> {
  const { store, nowMs } = run;
  const seen = decodeJob(doc.id, doc.data()).lease;
  if (!seen) throw new OwnershipLostError('the job has no lease');
  return store.transact<Outcome>(
    doc.id,
    (job) => {
      run.read(1);
      if (job.lease?.epoch !== seen.epoch) return 'the lease changed hands since the query';
      return null;
    },
    ({ job }) => Promise.resolve(committed(reclaimExpiredJob(job, store.options, nowMs), 'reclaimed')),
  );
}

/** The transition's record and events to commit, and its task to enqueue afterwards; quarantine is counted as such. */
function committed(transition: Transition<JobRecord>, counter: Action): { next: JobRecord; events: readonly EventDraft[]; value: Outcome } {
  const action: Action = transition.next.status === 'quarantined' ? 'quarantined' : counter;
  const value: Outcome = transition.dispatch ? { counter: action, enqueue: { task: transition.dispatch.task, id: transition.dispatch.id } } : { counter: action };
  return { next: transition.next, events: transition.events, value };
}

// ---- Units: a transaction over the job and one unit -------------------------------------------

interface UnitTransaction {
  readonly tx: Transaction;
  readonly job: JobRecord | null;
  readonly jobSnapshot: DocumentSnapshot;
  readonly unit: UnitRecord;
  readonly unitSnapshot: DocumentSnapshot;
}

async function inUnitTransaction(run: Sweep, doc: QueryDocumentSnapshot, body: (context: UnitTransaction) => Outcome | Promise<Outcome>): Promise<Outcome> {
  const { store } = run;
  const unitRef = doc.ref;
  const jobRef = unitRef.parent.parent;
  if (!jobRef) throw new Error(`Unit ${unitRef.path} is not under a job`);
  return store.retryingWrite(`sweep of unit ${unitRef.path}`, () =>
    store.runTransaction(async (tx): Promise<Outcome> => {
      const [jobSnapshot, unitSnapshot] = await tx.getAll(jobRef, unitRef);
      run.read(2);
      if (!jobSnapshot || !unitSnapshot?.exists) return { counter: 'skipped', reason: 'the unit is gone' };
      const unit = decodeUnit(unitRef.path, unitSnapshot.data());
      let job: JobRecord | null;
      try {
        job = jobSnapshot.exists ? decodeJob(jobRef.id, jobSnapshot.data()) : null;
      } catch (error) {
        if (!(error instanceof UnreadableJobError)) throw error;
        // Its job can run nothing: the unit leaves the sweep here, and the job is ended once this commits.
        store.commitUnit(tx, unitSnapshot, parkUnit(unit, { why: "its job's document cannot be read" }, run.nowMs).next);
        return { counter: 'parkedUnits', unreadableJob: error };
      }
      return body({ tx, job, jobSnapshot, unit, unitSnapshot });
    }),
  );
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
function park(run: Sweep, context: UnitTransaction): Outcome {
  const { job, unit } = context;
  const why = job === null ? 'its job no longer exists' : TERMINAL_STATUSES.has(job.status) ? `its job is ${job.status}` : `its job left fan-out epoch ${unit.fanoutEpoch}`;
  run.store.commitUnit(context.tx, context.unitSnapshot, parkUnit(unit, { why }, run.nowMs).next);
  return { counter: 'parkedUnits' };
}

/** The commit outcome of a unit transition: its task, once committed. */
function withDispatch(counter: Action, transition: Transition<UnitRecord>): Outcome {
  return transition.dispatch ? { counter, enqueue: { task: transition.dispatch.task, id: transition.dispatch.id } } : { counter };
}

// ---- Rule 2: expired unit leases ---------------------------------------------------------------

async function reclaimUnitLease(run: Sweep, doc: QueryDocumentSnapshot): Promise<Outcome> {
  const { store, nowMs } = run;
  const seen = decodeUnit(doc.ref.path, doc.data()).lease;
  if (!seen) throw new OwnershipLostError('the unit has no lease');
  return inUnitTransaction(run, doc, async (context) => {
    const { tx, job, unit } = context;
    if (unit.status !== 'running' || unit.lease?.epoch !== seen.epoch) return { counter: 'skipped', reason: 'the unit changed since the query' };
    if (unit.lease.expiresAtMs > nowMs) return { counter: 'skipped', reason: 'the lease was extended since the query' };
    if (fanOutEnded(job, unit)) return park(run, context);
    if (job === null || !inFanOut(job, unit)) return { counter: 'skipped', reason: `the job is ${job?.status ?? 'gone'}, not in this unit's fan-out` };
    // The budget is the unit's own; the rule is the same as for a job.
    const reclaimed = reclaimExpiredUnit(unit, store.options, nowMs);
    if (reclaimed.quarantine !== undefined) {
      // Every read of the transaction before its first write: the fan-out's other units, for their cost.
      const ended = await endFanOutFromUnit(store, tx, job, reclaimed.next, quarantineJobForUnit(job, { reason: reclaimed.quarantine }, nowMs).next, tx);
      store.commitUnit(tx, context.unitSnapshot, ended.nextUnit);
      store.commitJob(tx, context.jobSnapshot, job, ended.next, reclaimed.events);
      return { counter: 'quarantined' };
    }
    store.commitUnit(tx, context.unitSnapshot, reclaimed.next);
    store.commitJob(tx, context.jobSnapshot, job, job, reclaimed.events);
    return withDispatch('unitsReclaimed', reclaimed);
  });
}

// ---- Rule 3: lost tasks ------------------------------------------------------------------------

async function redispatchJob(run: Sweep, doc: QueryDocumentSnapshot, lostBefore: number): Promise<Outcome> {
  const { store, nowMs } = run;
  const seen = decodeJob(doc.id, doc.data());
  return store.transact<Outcome>(
    doc.id,
    (job) => {
      run.read(1);
      if (job.status === 'queued' && (job.step !== seen.step || job.dispatch !== seen.dispatch)) return 'the job was dispatched again since the query';
      return null;
    },
    ({ job }) => Promise.resolve(committed(redispatchQueuedJob(job, { lostBeforeMs: lostBefore }, nowMs), 'redispatched')),
  );
}

async function redispatchUnit(run: Sweep, doc: QueryDocumentSnapshot, lostBefore: number): Promise<Outcome> {
  const { store, nowMs } = run;
  const seen = decodeUnit(doc.ref.path, doc.data());
  return inUnitTransaction(run, doc, (context) => {
    const { tx, job, unit } = context;
    if (unit.status !== 'queued' || unit.step !== seen.step || unit.dispatch !== seen.dispatch || unit.fanoutEpoch !== seen.fanoutEpoch) {
      return { counter: 'skipped', reason: 'the unit changed since the query' };
    }
    if (unit.nextRunAtMs > lostBefore) return { counter: 'skipped', reason: 'the unit is not overdue any more' };
    if (fanOutEnded(job, unit)) return park(run, context);
    if (job === null || !inFanOut(job, unit)) return { counter: 'skipped', reason: `the job is ${job?.status ?? 'gone'}, not in this unit's fan-out` };
    const redispatched = redispatchQueuedUnit(unit, { lostBeforeMs: lostBefore }, nowMs);
    store.commitUnit(tx, context.unitSnapshot, redispatched.next);
    store.commitJob(tx, context.jobSnapshot, job, job, redispatched.events);
    return withDispatch('unitsRedispatched', redispatched);
  });
}

// ---- Rule 4: provider waits that are over ------------------------------------------------------

async function resumeWait(run: Sweep, doc: QueryDocumentSnapshot): Promise<Outcome> {
  const { store, nowMs } = run;
  return store.transact<Outcome>(
    doc.id,
    () => {
      run.read(1);
      return null;
    },
    ({ job }) => Promise.resolve(committed(resumeWaitJob(job, nowMs), 'resumed')),
  );
}
