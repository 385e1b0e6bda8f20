/**
 * Reconciliation after a job stopped (cancelled, failed, quarantined): nobody holds a claim any
 * more, so no worker will settle the effects it left `applying` or `unknown`. This looks each one
 * up in the system of record, records what it finds, and brings the job's structured effect
 * counts (its cancellation record, its progress figures) and its next check time in line with the
 * ledger. The sweeper runs it (engine/settle-stopped.ts); nothing here is found by its wording.
 *
 * Its writes go through the store's door (JobStore.apply), decided from the job and the entry as
 * read beside it and conditioned on both (the entry's write on its update time; the job, rewritten
 * as read, on its own): a stopped job has no owner whose claim could be checked, and no worker can
 * write to it any more (every owner-checked write needs `running`). A stopped job's ledger moves
 * only in commits that write the job too (this pass's, a release's or a re-drive's), so the job's
 * precondition fences what the counts are decided from. No lock is taken: a pass that dies
 * deciding holds nobody up.
 */
import { describeError, OwnershipLostError } from '../core/errors';
import type { JobRecord, JobStatus, StoppedEffects } from '../core/job';
import type { JobStore } from '../store/job-store';
import { effectReplaced, readEffectVersion } from '../store/effect-access';
import { allEffectEntries, parseEffectEntry } from '../store/firestore-ledger';
import { applyChange, countEffectStates, DEFAULT_IN_FLIGHT_GRACE_MS, inFlightGraceMs, inFlightUntilMs, UNRESOLVED_EFFECT_STATES, type EffectChange, type EffectEntry } from './ledger';
import type { EffectAdapter, LookupOutcome } from './port';
import { stoppedEffectsSentence } from './stop-report';

/** How the stopped-effects pass closes an effect the system of record does not have: failed because its job stopped, not because the target refused it. */
const STOPPED_JOB_DOES_NOT_RETRY = 'a stopped job does not retry';

/** Whether an entry failed only because its job had stopped (a re-drive may send it again, after a lookup). */
export function failedBecauseStopped(entry: Pick<EffectEntry, 'state' | 'resolution'>): boolean {
  return entry.state === 'failed' && (entry.resolution ?? '').endsWith(STOPPED_JOB_DOES_NOT_RETRY);
}

export interface StoppedReconcileOptions {
  /**
   * An entry that went unknown more recently than this is left for a later run when the target
   * does not have it: its request may still be on its way. Found entries are recorded at once.
   */
  readonly settleGraceMs?: number;
  /** The pipeline's own progress figures, recomputed from the ledger. */
  readonly progress?: (entries: readonly EffectEntry[]) => Record<string, number>;
  readonly signal?: AbortSignal;
  /** "Now" for the grace decisions (the sweeper passes its scheduled time); the store's clock otherwise. */
  readonly nowMs?: number;
  /** Lookups this run may make; the rest wait for the next run. */
  readonly maxLookups?: number;
}

export interface StoppedReconcileResult {
  /** Entries looked up in this run. */
  readonly checked: number;
  readonly foundApplied: number;
  readonly notApplied: number;
  /** Entries still `applying` or `unknown` after this run. */
  readonly stillUnknown: number;
  /** The ledger's states after this run: final once `settled`. */
  readonly effects: StoppedEffects;
  /** When the ledger should be checked again, or null once it is settled. */
  readonly nextCheckAtMs: number | null;
  /** A lookup could not get an answer: the target is down or unreachable. */
  readonly unreachable: boolean;
}

const STOPPED: ReadonlySet<JobStatus> = new Set(['cancelled', 'failed', 'quarantined']);
/** A stopped job's grace: a minute after the stop, as for an adapter that states no deadline (core/effect-ledger.ts). */
export const DEFAULT_SETTLE_GRACE_MS = DEFAULT_IN_FLIGHT_GRACE_MS;
/** Longest gap between two checks of a ledger whose target cannot answer. */
export const MAX_SETTLE_RECHECK_MS = 3_600_000;
export const DEFAULT_MAX_LOOKUPS_PER_JOB = 50;

export function isStopped(job: Pick<JobRecord, 'status'>): boolean {
  return STOPPED.has(job.status);
}

/** When the job stopped: its finish time, else its cancel time, else its last write. */
export function stoppedAtMs(job: Pick<JobRecord, 'finishedAtMs' | 'cancellation' | 'updatedAtMs'>): number {
  return job.finishedAtMs ?? job.cancellation?.atMs ?? job.updatedAtMs;
}

/**
 * The next check of a ledger the target could not (fully) answer for: as long again as the job has
 * been stopped, at least the grace period and at most an hour. Stateless, so no counter is stored.
 */
export function settleRecheckAtMs(nowMs: number, stoppedMs: number, graceMs: number): number {
  return nowMs + Math.min(MAX_SETTLE_RECHECK_MS, Math.max(graceMs, nowMs - stoppedMs));
}

function stoppedCheck(job: JobRecord): string | null {
  return isStopped(job) ? null : `Job ${job.id} is ${job.status}: only a stopped job's effects are reconciled from outside`;
}

async function recordOutcome(store: JobStore, jobId: string, key: string, change: EffectChange): Promise<boolean> {
  return store.apply({ kind: 'job-record', jobId }, async ({ job }) => {
    refuseUnlessStopped(job);
    const effect = await readEffectVersion(store, jobId, key);
    if (effect === null) return { value: false };
    const entry = parseEffectEntry(effect.read.path, effect.data);
    if (!UNRESOLVED_EFFECT_STATES.includes(entry.state)) return { value: false };
    return { documents: [effectReplaced(effect, applyChange(entry, change, entry.epoch, store.clock.now()))], value: true };
  });
}

function refuseUnlessStopped(job: JobRecord): void {
  const refusal = stoppedCheck(job);
  if (refusal !== null) throw new OwnershipLostError(refusal);
}

async function lookupQuietly(adapter: EffectAdapter, key: string, signal: AbortSignal): Promise<LookupOutcome> {
  try {
    return await adapter.lookup(key, signal);
  } catch (error) {
    signal.throwIfAborted();
    // An adapter that throws breaks its port's contract; nobody can tell all the same.
    return { kind: 'unreachable', reason: `the adapter threw: ${describeError(error)}` };
  }
}

export async function reconcileStoppedJob(store: JobStore, adapter: EffectAdapter, jobId: string, options: StoppedReconcileOptions = {}): Promise<StoppedReconcileResult> {
  const job = await store.read(jobId);
  if (!job) throw new Error(`No job ${jobId}`);
  const refusal = stoppedCheck(job);
  if (refusal !== null) throw new Error(refusal);
  const signal = options.signal ?? new AbortController().signal;
  const graceMs = options.settleGraceMs ?? DEFAULT_SETTLE_GRACE_MS;
  // An entry left `applying` was last written just before its request went out, and one a cancel marked `unknown` was in flight then: either may land until the adapter's own deadline plus the margin, however short the configured grace.
  const inFlightGrace = adapter.sendTimeoutMs === undefined ? graceMs : Math.max(graceMs, inFlightGraceMs(adapter.sendTimeoutMs));
  const nowMs = options.nowMs ?? store.clock.now();
  const maxLookups = options.maxLookups ?? DEFAULT_MAX_LOOKUPS_PER_JOB;

  const unresolved = (await allEffectEntries(store.db, jobId)).filter((entry) => UNRESOLVED_EFFECT_STATES.includes(entry.state));
  let checked = 0;
  let foundApplied = 0;
  let notApplied = 0;
  /** The earliest end of a grace period an entry the target does not have yet is waiting for. */
  let graceEndsMs: number | null = null;
  /** The target could not answer, or this run ran out of lookups: ask again after a pause. */
  let askAgainLater = false;
  let unreachable = false;
  for (const entry of unresolved) {
    if (checked >= maxLookups) {
      askAgainLater = true;
      break;
    }
    checked += 1;
    const lookup = await lookupQuietly(adapter, entry.idempotencyKey, signal);
    const countUnknown = entry.state === 'applying';
    if (lookup.kind === 'found') {
      const written = await recordOutcome(store, jobId, entry.key, {
        state: 'applied',
        evidence: lookup.evidence,
        reconciled: true,
        countLookup: true,
        countUnknown,
        lastOutcome: `found at ${adapter.name} by lookup after the job stopped`,
        resolution: `found applied at ${adapter.name} after the job stopped`,
      });
      if (written) foundApplied += 1;
      continue;
    }
    if (lookup.kind === 'unreachable') {
      // The target cannot answer now; the other entries would get the same answer.
      askAgainLater = true;
      unreachable = true;
      break;
    }
    const endsMs = inFlightUntilMs(entry, inFlightGrace);
    if (nowMs >= endsMs) {
      const written = await recordOutcome(store, jobId, entry.key, {
        state: 'failed',
        countLookup: true,
        countUnknown,
        lastOutcome: `not found at ${adapter.name} after the job stopped`,
        resolution: `not applied: ${adapter.name} does not have it, and ${STOPPED_JOB_DOES_NOT_RETRY}`,
      });
      if (written) notApplied += 1;
      continue;
    }
    graceEndsMs = Math.min(graceEndsMs ?? endsMs, endsMs);
  }

  return store.apply({ kind: 'job-record', jobId }, async ({ job: current }) => {
    refuseUnlessStopped(current);
    const entries = await allEffectEntries(store.db, jobId);
    const counts = countEffectStates(entries);
    const stillUnknown = counts.applying + counts.unknown;
    const settled = stillUnknown === 0;
    const effects: StoppedEffects = { counts, settled, checkedWith: adapter.name, checkedAtMs: nowMs };
    const candidates = [...(graceEndsMs === null ? [] : [graceEndsMs]), ...(askAgainLater ? [settleRecheckAtMs(nowMs, stoppedAtMs(current), graceMs)] : [])];
    // An entry still unresolved that this run did not explain (it appeared since the read): the next run looks.
    const nextCheckAtMs = settled ? null : candidates.length > 0 ? Math.min(...candidates) : nowMs + graceMs;
    const next: JobRecord = {
      ...current,
      cancellation: current.cancellation && { ...current.cancellation, effects },
      progress: options.progress ? { ...current.progress, ...options.progress(entries) } : current.progress,
      effectsToSettleAtMs: nextCheckAtMs,
    };
    const message =
      `Checked ${checked} of ${unresolved.length} effects left unresolved with ${adapter.name}: ${foundApplied} found applied, ` +
      `${notApplied} not applied, ${stillUnknown} still unknown. ${stoppedEffectsSentence(effects)}`;
    return {
      next,
      events: checked > 0 ? [{ kind: 'effects-reconciled', message }] : [],
      value: { checked, foundApplied, notApplied, stillUnknown, effects, nextCheckAtMs, unreachable },
    };
  });
}
