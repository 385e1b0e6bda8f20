/**
 * Where a step's decision becomes durable: the one place that folds the claim's tally (progress,
 * cost and notes the flusher had not written yet) into the holder's record, applies the change
 * through the store's door and maps a lost claim to the step's outcome. Beside it, the decisions
 * every step can end with: a caught error (requeue, capped outage wait, fail), a stall (give the
 * claim back), a wait — for a job, or for a unit, whose moves end its job's fan-out.
 */
import { describeError, OwnershipLostError, type PhaselineError } from '../../core/errors';
import { failViaUnit, quarantineViaUnit, waitViaUnit } from '../../core/fan-out-moves';
import { applyClaimTally, EMPTY_FLUSH, type FlushPayload } from '../../core/flusher';
import { type JobRecord, type JobWait, type UnitRecord } from '../../core/job';
import { decideAfterError, type ErrorDecision } from '../../core/lifecycle';
import { giveBackJob, giveBackUnit, requeueUnit, settleJobError, waitJob } from '../../core/transitions';
import type { Change, ClaimHolder, EventDraft, JobCurrent, UnitCurrent } from '../../store/door';
import { fanOutMoveChange } from '../ended-fan-out';
import type { RunnerDeps, StepOutcome } from './deps';

export type JobHolder = Extract<ClaimHolder, { readonly kind: 'job' }>;
export type UnitHolder = Extract<ClaimHolder, { readonly kind: 'unit' }>;

/** A claim held by this step, with what its decisions need. */
export interface Holding<H extends ClaimHolder = ClaimHolder> {
  readonly deps: RunnerDeps;
  readonly holder: H;
}

/** The records a decision is made from, its holder's with the claim tally folded in: the job's, or the job as read and the unit's. */
export type RecordsOf<H extends ClaimHolder> = H extends JobHolder ? { readonly job: JobRecord } : { readonly job: JobRecord; readonly unit: UnitRecord };

/** A decision's change: its events come after the tally's notes, `lead` before them. */
export interface Decided<T> extends Change<T> {
  readonly lead?: readonly EventDraft[];
}

/** What a step decided, as a function of the records the commit reads (it may be made again on a lost race: no side effects). */
export type Decision<H extends ClaimHolder, T = StepOutcome> = (records: RecordsOf<H>) => Decided<T> | Promise<Decided<T>>;

/** The claim's tally folded into its record (idempotent per epoch: a commit made again adds nothing twice). Nothing pending: the record as it is. */
export function foldTally<R extends JobRecord | UnitRecord>(record: R, pending: FlushPayload, epoch: number): { readonly record: R; readonly notes: readonly EventDraft[] } {
  if (pending === EMPTY_FLUSH) return { record, notes: [] };
  const applied = applyClaimTally(record, pending, epoch);
  return { record: applied.next, notes: applied.notes };
}

/** Commits a decision through the door, the tally folded in. A lost claim is thrown (OwnershipLostError). */
export function commitTallied<H extends ClaimHolder, T>(holding: Holding<H>, pending: FlushPayload, decision: Decision<H, T>): Promise<T> {
  const holder: ClaimHolder = holding.holder;
  return holding.deps.store.apply(holder, async (current: JobCurrent | UnitCurrent) => {
    const { records, notes } = holder.kind === 'job' ? tallyJob(current, pending, holder.claim.epoch) : tallyUnit(current as UnitCurrent, pending, holder.claim.epoch);
    const decided = await decision(records as RecordsOf<H>);
    return { ...decided, events: [...(decided.lead ?? []), ...notes, ...(decided.events ?? [])] };
  });
}

function tallyJob(current: JobCurrent, pending: FlushPayload, epoch: number) {
  const { record, notes } = foldTally(current.job, pending, epoch);
  return { records: { job: record }, notes };
}

function tallyUnit(current: UnitCurrent, pending: FlushPayload, epoch: number) {
  const { record, notes } = foldTally(current.unit, pending, epoch);
  return { records: { job: current.job, unit: record }, notes };
}

/** Commits a step's last decision and answers its outcome; a claim lost meanwhile is the outcome `ownership-lost`. */
export async function settle<H extends ClaimHolder>(holding: Holding<H>, pending: FlushPayload, decision: Decision<H>): Promise<StepOutcome> {
  try {
    return await commitTallied(holding, pending, decision);
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(holding.deps, error);
    throw error;
  }
}

export function lost(deps: RunnerDeps, reason: unknown): StepOutcome {
  deps.log?.('step stopped: ownership lost', { reason: describeError(reason) });
  return { kind: 'ownership-lost', reason: describeError(reason) };
}

/**
 * A decision that may find it cannot be made (`isRefusal` says which errors: a pipeline defect, state
 * only a newer worker reads): that error is settled in the same commit instead, as a caught error.
 */
export function settlingRefusals<H extends ClaimHolder>(holding: Holding<H>, decision: Decision<H>, isRefusal: (error: unknown) => error is PhaselineError, notes: readonly EventDraft[] = []): Decision<H> {
  return async (records) => {
    try {
      return await decision(records);
    } catch (error) {
      if (!isRefusal(error)) throw error;
      return (errorDecision(holding, error, notes) as Decision<H>)(records);
    }
  };
}

function isJobHolding(holding: Holding): holding is Holding<JobHolder> {
  return holding.holder.kind === 'job';
}

/** The outcome an error decision answers. */
function errorOutcome(decision: ErrorDecision, nowMs: number): StepOutcome {
  switch (decision.action) {
    case 'requeue':
      return { kind: 'requeued', attempts: decision.attempts, delayMs: decision.nextRunAtMs - nowMs };
    case 'wait':
      return { kind: 'waiting', reason: 'provider' };
    case 'fail':
      return { kind: 'failed', reason: decision.reason };
  }
}

/** A caught error: requeue with backoff inside the budget, wait out a capped outage, otherwise fail. `notes` lead the job's events. */
export function errorDecision(holding: Holding, error: PhaselineError, notes: readonly EventDraft[] = []): Decision<ClaimHolder> {
  const { store, random } = holding.deps;
  const nowMs = store.clock.now();
  if (isJobHolding(holding)) {
    const decide: Decision<JobHolder> = ({ job }) => {
      const decision = decideAfterError(job, error, store.options, nowMs, random);
      const transition = settleJobError(job, { decision, error: { code: error.code, message: error.message, retryable: error.retryable, atMs: nowMs } }, nowMs);
      return { lead: notes, next: transition.next, events: transition.events, dispatch: transition.dispatch, value: errorOutcome(decision, nowMs) };
    };
    return decide;
  }
  const decide: Decision<UnitHolder> = async ({ job, unit }) => {
    const decision = decideAfterError(unit, error, store.options, nowMs, random);
    const lastError = { code: error.code, message: error.message, atMs: nowMs };
    if (decision.action !== 'fail') {
      // A capped server delay holds only this unit back; its siblings go on, so it waits as a queued unit.
      const untilMs = decision.action === 'requeue' ? decision.nextRunAtMs : decision.untilMs;
      const message = decision.action === 'requeue' ? `${unit.unit}: attempt ${decision.attempts} failed (${error.code}: ${error.message})` : `${unit.unit}: ${error.message}: ${decision.reason}`;
      const transition = requeueUnit(unit, { attempts: decision.attempts, untilMs, message, kind: decision.action === 'requeue' ? 'retrying' : 'waiting', lastError }, nowMs);
      return { nextUnit: transition.next, events: transition.events, dispatch: transition.dispatch, value: { kind: 'requeued', attempts: decision.attempts, delayMs: untilMs - nowMs } };
    }
    const reason = `unit ${unit.unit}: ${decision.reason}`;
    const jobError = { code: error.code, message: `${unit.unit}: ${error.message}`, retryable: error.retryable, atMs: nowMs };
    const failed = await fanOutMoveChange(store, job, (others) => failViaUnit(job, unit, others, { reason, error: jobError, lastError }, nowMs));
    return { ...failed, value: { kind: 'failed', reason } };
  };
  return decide;
}

/**
 * A stalled step gives its job (or unit) back at once, counted as a lost worker (the quarantine
 * rule applies), rather than holding it until the platform kills the function.
 */
export function giveBackDecision(holding: Holding, why: string): Decision<ClaimHolder> {
  const { store } = holding.deps;
  const nowMs = store.clock.now();
  const outcome: StepOutcome = { kind: 'stalled', reason: why };
  if (isJobHolding(holding)) {
    const decide: Decision<JobHolder> = ({ job }) => {
      const transition = giveBackJob(job, { why, options: store.options }, nowMs);
      return { next: transition.next, events: transition.events, dispatch: transition.dispatch, value: outcome };
    };
    return decide;
  }
  const decide: Decision<UnitHolder> = async ({ job, unit }) => {
    const transition = giveBackUnit(unit, { why, options: store.options }, nowMs);
    const { quarantine } = transition;
    if (quarantine === undefined) return { nextUnit: transition.next, events: transition.events, dispatch: transition.dispatch, value: outcome };
    return { ...(await fanOutMoveChange(store, job, (others) => quarantineViaUnit(job, { ...transition, quarantine }, others, nowMs))), value: outcome };
  };
  return decide;
}

/**
 * The job waits (for a person, a provider, the owner's spend cap). A unit's step makes its whole
 * job wait: the fan-out ends here (the unit back to queued, `message` on the timeline), and on
 * resume it starts again, reusing finished units and recorded sections. `notes` lead a job's events.
 */
export function waitDecision(holding: Holding, waiting: JobWait, told: { readonly notes?: readonly EventDraft[]; readonly message: string; readonly reason?: string }): Decision<ClaimHolder> {
  const { store } = holding.deps;
  const nowMs = store.clock.now();
  const outcome: StepOutcome = { kind: 'waiting', reason: told.reason ?? waiting.reason };
  if (isJobHolding(holding)) {
    const decide: Decision<JobHolder> = ({ job }) => {
      const transition = waitJob(job, waiting, nowMs);
      return { lead: told.notes ?? [], next: transition.next, events: transition.events, value: outcome };
    };
    return decide;
  }
  const decide: Decision<UnitHolder> = async ({ job, unit }) => ({
    ...(await fanOutMoveChange(store, job, (others) => waitViaUnit(job, unit, others, { wait: waiting, message: told.message }, nowMs))),
    value: outcome,
  });
  return decide;
}
