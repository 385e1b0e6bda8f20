/**
 * The sweeper's pass over the effects of stopped jobs. A job cancelled, failed or quarantined
 * while an effect was in flight (or unknown) has no worker left to find out what happened to it;
 * this pass asks the system of record, through the pipeline's effect adapter, and makes the job's
 * effect counts final (effects/after-stop.ts does the asking and the recording).
 *
 * Which jobs: those whose `effectsToSettleAt` is due, by one index-backed query per stopped status
 * (indexed-queries.ts), paged and bounded like the sweeper's own. The field is set when a job first
 * sends an effect and by a cancel, and cleared once nothing is unresolved, so the queries return
 * only work still to do, never every stopped job.
 *
 * When: not before the grace period after the job stopped (a request sent just before the stop may
 * still be on its way to the target). A job found earlier has its check moved to the end of the
 * grace period. A target that cannot answer is asked again later (longer and longer, at most hourly)
 * and, within one pass, not again for other jobs.
 */
import type { QueryDocumentSnapshot } from 'firebase-admin/firestore';
import { describeError, OwnershipLostError } from '../core/errors';
import type { JobRecord } from '../core/job';
import {
  DEFAULT_SETTLE_GRACE_MS,
  isStopped,
  reconcileStoppedJob,
  settleRecheckAtMs,
  stoppedAtMs,
  type StoppedReconcileResult,
} from '../effects/after-stop';
import type { EffectEntry } from '../effects/ledger';
import type { EffectAdapter } from '../effects/port';
import type { Change } from '../store/door';
import { unresolvedEffectsOf } from '../store/effect-access';
import type { JobStore } from '../store/job-store';
import { timestampMillis, type PageCursor } from '../store/sweep-queries';
import type { SweepQueryName } from './indexed-queries';
import { readPassPage } from './sweep-pages';
import { forEachLimited } from './concurrency';

/** How a pipeline's effects are checked after its job stopped. */
export interface StoppedEffectsSettler {
  readonly adapter: EffectAdapter;
  /** The pipeline's progress figures recomputed from the ledger, so they agree with it. */
  readonly progress?: (entries: readonly EffectEntry[]) => Record<string, number>;
}

/** How the sweeper checks stopped jobs' effects: the settler per pipeline, and the grace period after a stop. */
export interface StoppedEffectsDeps {
  /** The settler for a pipeline, or null when it has no effects. May throw when its configuration is missing. */
  readonly settlerFor: (pipeline: string) => StoppedEffectsSettler | null;
  readonly settleGraceMs?: number;
}

export interface SettleStoppedReport {
  /** Jobs whose ledger was checked with its system of record. */
  readonly checked: number;
  /** Jobs whose effect counts are now final. */
  readonly settled: number;
  /** Jobs stopped less than the grace period ago: their check was moved to its end. */
  readonly deferred: number;
  /** Jobs with an entry still unknown after the check (the target could not say yet): checked again later. */
  readonly pending: number;
  readonly effectsFoundApplied: number;
  readonly effectsNotApplied: number;
  /** Jobs that changed between the query and the commit, left alone. */
  readonly skipped: number;
  /** Jobs that could not be handled (logged); each is checked again later. */
  readonly errors: number;
  /** Jobs found due but left for the next run: the pass was past its time bound (`untilMs`) when their turn came. */
  readonly carriedOver: number;
  readonly queryPages: number;
  readonly queryDocuments: number;
  /** Queries that stopped at the page limit with more to do: the next run continues. */
  readonly truncated: readonly SweepQueryName[];
}

export const SETTLE_QUERIES: readonly SweepQueryName[] = ['cancelledEffectsToSettle', 'failedEffectsToSettle', 'quarantinedEffectsToSettle'];
/** Pages each query may read per run. */
export const SETTLE_MAX_PAGES = 5;
/** Jobs checked at once: each check waits on the target's answers. */
export const SETTLE_CONCURRENCY = 4;
/** How long a job whose pipeline has no settler (or whose settler is not configured) waits before it is tried again. */
const NO_SETTLER_RETRY_MS = 3_600_000;

type Log = (message: string, detail?: Record<string, unknown>) => void;
type Counter = Exclude<keyof SettleStoppedReport, 'truncated'>;

/** What the first commit decided for a job. */
type Triage = { readonly action: 'settled' | 'deferred' } | { readonly action: 'check'; readonly job: JobRecord };

/**
 * One pass at `nowMs`. Without `effects` (no adapters wired) it does nothing: the deployed trigger
 * and the local stack always wire them. Never throws for a single job or query: see the report.
 */
export async function settleStoppedEffects(
  deps: { readonly store: JobStore; readonly stoppedEffects?: StoppedEffectsDeps; readonly log?: Log },
  nowMs: number,
  /** `untilMs`: on the store's clock, when the pass starts no further job's check (those left are still due: the next run checks them). */
  bounds: { readonly untilMs?: number } = {},
): Promise<SettleStoppedReport> {
  const counts: Record<Counter, number> = {
    checked: 0,
    settled: 0,
    deferred: 0,
    pending: 0,
    effectsFoundApplied: 0,
    effectsNotApplied: 0,
    skipped: 0,
    errors: 0,
    carriedOver: 0,
    queryPages: 0,
    queryDocuments: 0,
  };
  const truncated: SweepQueryName[] = [];
  const pastBound = (): boolean => bounds.untilMs !== undefined && deps.store.clock.now() > bounds.untilMs;
  const effects = deps.stoppedEffects;
  if (!effects) return { ...counts, truncated };
  const { store } = deps;
  const log: Log = deps.log ?? ((message, detail) => console.warn(JSON.stringify({ severity: 'WARNING', message, ...detail })));
  const graceMs = effects.settleGraceMs ?? DEFAULT_SETTLE_GRACE_MS;
  const unreachableTargets = new Set<string>();
  const batch = Math.max(1, Math.floor(store.options.sweepBatchSize));

  const deferTo = (jobId: string, seenMs: number, atMs: number): Promise<void> =>
    store.apply({ kind: 'job-record', jobId }, ({ job }) => {
      refuseUnlessDue(job, nowMs, seenMs);
      return { next: { ...job, effectsToSettleAtMs: atMs }, value: undefined };
    });

  const handle = async (doc: QueryDocumentSnapshot): Promise<void> => {
    const seenMs = timestampMillis(doc, 'effectsToSettleAt');
    if (seenMs === null) return; // cannot happen: the query matched a timestamp range
    // Read beside the job, not in a transaction: a stopped job's ledger moves only in commits that write the job too
    // (the pass's own, a release's, a re-drive's), so the job's precondition fences what this decides from.
    const triage = await store.apply({ kind: 'job-record', jobId: doc.id }, async ({ job }): Promise<Change<Triage>> => {
      refuseUnlessDue(job, nowMs, seenMs);
      const unresolved = await unresolvedEffectsOf(store, job.id, 1);
      // Nothing unresolved and nothing reported as unsettled: nothing to ask anyone.
      if (unresolved.length === 0 && job.cancellation?.effects?.settled !== false) {
        return { next: { ...job, effectsToSettleAtMs: null }, value: { action: 'settled' } };
      }
      const dueMs = stoppedAtMs(job) + graceMs;
      if (dueMs > nowMs) return { next: { ...job, effectsToSettleAtMs: dueMs }, value: { action: 'deferred' } };
      return { value: { action: 'check', job } };
    });
    if (triage.action !== 'check') {
      counts[triage.action] += 1;
      return;
    }
    const { job } = triage;
    let settler: StoppedEffectsSettler | null;
    try {
      settler = effects.settlerFor(job.pipeline);
    } catch (error) {
      settler = null;
      log('settling stopped effects: the pipeline has no usable effect adapter', { jobId: job.id, pipeline: job.pipeline, error: describeError(error) });
    }
    if (settler === null) {
      counts.errors += 1;
      await deferTo(job.id, seenMs, nowMs + NO_SETTLER_RETRY_MS);
      return;
    }
    if (unreachableTargets.has(settler.adapter.name)) {
      counts.pending += 1;
      await deferTo(job.id, seenMs, settleRecheckAtMs(nowMs, stoppedAtMs(job), graceMs));
      return;
    }
    const result: StoppedReconcileResult = await reconcileStoppedJob(store, settler.adapter, job.id, {
      nowMs,
      settleGraceMs: graceMs,
      ...(settler.progress ? { progress: settler.progress } : {}),
    });
    if (result.unreachable) unreachableTargets.add(settler.adapter.name);
    counts.checked += 1;
    counts.effectsFoundApplied += result.foundApplied;
    counts.effectsNotApplied += result.notApplied;
    counts[result.effects.settled ? 'settled' : 'pending'] += 1;
  };

  const settleOne = async (name: SweepQueryName, doc: QueryDocumentSnapshot): Promise<void> => {
    if (pastBound()) {
      // Untouched, so still due: the next run's query finds it again.
      counts.carriedOver += 1;
      return;
    }
    try {
      await handle(doc);
    } catch (error) {
      if (error instanceof OwnershipLostError) {
        counts.skipped += 1;
        return;
      }
      counts.errors += 1;
      log('settling stopped effects: could not handle a job', { query: name, jobId: doc.id, error: describeError(error) });
    }
  };

  for (const name of SETTLE_QUERIES) {
    let cursor: PageCursor | null = null;
    let finished = false;
    const carriedBefore = counts.carriedOver;
    for (let page = 0; page < SETTLE_MAX_PAGES && !finished; page += 1) {
      if (pastBound()) break;
      const found = await readPassPage(store, name, nowMs, batch, cursor, { counts, log, message: 'settling stopped effects: query failed' });
      if (found === null) {
        finished = true;
        continue;
      }
      counts.queryPages += 1;
      counts.queryDocuments += found.docs.length;
      await forEachLimited(found.docs, SETTLE_CONCURRENCY, (doc) => settleOne(name, doc));
      if (found.next) cursor = found.next;
      else finished = true;
    }
    if (!finished || counts.carriedOver > carriedBefore) truncated.push(name);
  }
  return { ...counts, truncated };
}

/** The job is still stopped and its check is still the one the query found (another pass may have moved it). */
function dueCheck(job: JobRecord, nowMs: number, seenMs: number): string | null {
  if (!isStopped(job)) return `job is ${job.status} now`;
  const atMs = job.effectsToSettleAtMs ?? null;
  if (atMs === null) return 'its effects were settled since the query';
  if (atMs !== seenMs || atMs > nowMs) return 'its check was moved since the query';
  return null;
}

function refuseUnlessDue(job: JobRecord, nowMs: number, seenMs: number): void {
  const refusal = dueCheck(job, nowMs, seenMs);
  if (refusal !== null) throw new OwnershipLostError(refusal);
}
