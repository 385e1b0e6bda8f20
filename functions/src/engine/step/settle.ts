/** Settling what a step could not finish: a caught error (requeue, capped outage wait, fail), a stalled step giving its job back, and the same for units. */
import { OwnershipLostError, PhaselineError, SpendLimitReachedError, TerminalError } from '../../core/errors';
import { applyClaimTally, EMPTY_FLUSH, type FlushPayload } from '../../core/flusher';
import { type JobWait } from '../../core/job';
import { budgetWait, decideAfterError } from '../../core/lifecycle';
import { failJobForUnit, giveBackJob, giveBackUnit, quarantineJobForUnit, settleJobError, requeueUnit, waitJob, type Dispatch } from '../../core/transitions';
import type { JobClaim, UnitClaim } from '../../core/claims';
import type { EventDraft } from '../../store/door';
import { endFanOutFromUnit } from '../ended-fan-out';
import { NoProgressError, RunnerDeps, Running, SectionOwner, StepOutcome, dispatchQuietly, lost } from './running';

/**
 * A stalled step gives its job (or unit) back at once, counted as a lost worker (the quarantine
 * rule applies), rather than holding it until the platform kills the function.
 */
export async function giveBack(running: Running, owner: SectionOwner, stall: NoProgressError, pending: FlushPayload): Promise<StepOutcome> {
  const { store } = running.deps;
  const nowMs = store.clock.now();
  running.deps.log?.('step stalled; giving the job back', { reason: stall.message });
  try {
    if (owner.kind === 'job') {
      const { claim } = owner;
      const given = await store.asOwner(claim, ({ job }) => {
        const applied = applyClaimTally(job, pending, claim.epoch);
        const transition = giveBackJob(applied.next, { why: stall.message, options: store.options }, nowMs);
        return Promise.resolve({ next: transition.next, events: [...applied.notes, ...transition.events], value: transition.dispatch });
      });
      await dispatchQuietly(running.deps, given);
      return { kind: 'stalled', reason: stall.message };
    }
    const { claim } = owner;
    const given = await store.commitAsUnitOwner(claim, async ({ tx, job, unit }) => {
      const applied = applyClaimTally(unit, pending, claim.epoch);
      const transition = giveBackUnit(applied.next, { why: stall.message, options: store.options }, nowMs);
      if (transition.quarantine !== undefined) {
        const ended = await endFanOutFromUnit(store, tx, job, transition.next, quarantineJobForUnit(job, { reason: transition.quarantine }, nowMs).next);
        return { ...ended, events: [...applied.notes, ...transition.events], value: undefined };
      }
      return { nextUnit: transition.next, events: [...applied.notes, ...transition.events], value: transition.dispatch };
    });
    await dispatchQuietly(running.deps, given);
    return { kind: 'stalled', reason: stall.message };
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    throw error;
  }
}

/** How a unit's error was settled: requeued (with its task to enqueue) or the whole job failed. */
export type SettledUnitError =
  | { readonly kind: 'requeued'; readonly attempts: number; readonly delayMs: number; readonly dispatch: Dispatch | undefined }
  | { readonly kind: 'failed'; readonly reason: string };

/** Records a caught error: requeue with backoff inside the budget, wait out a capped outage, otherwise fail. */
export async function settleError(deps: RunnerDeps, claim: JobClaim, error: PhaselineError, pending: FlushPayload, notes: readonly EventDraft[] = []): Promise<StepOutcome> {
  const { store } = deps;
  const nowMs = store.clock.now();
  try {
    const settled = await store.asOwner(claim, ({ job }) => {
      const decision = decideAfterError(job, error, store.options, nowMs, deps.random);
      const applied = applyClaimTally(job, pending, claim.epoch);
      const transition = settleJobError(applied.next, { decision, error: { code: error.code, message: error.message, retryable: error.retryable, atMs: nowMs } }, nowMs);
      return Promise.resolve({ next: transition.next, events: [...notes, ...applied.notes, ...transition.events], value: { transition, decision } });
    });
    const { transition, decision } = settled;
    await dispatchQuietly(deps, transition.dispatch);
    switch (decision.action) {
      case 'requeue':
        return { kind: 'requeued', attempts: decision.attempts, delayMs: decision.nextRunAtMs - nowMs };
      case 'wait':
        return { kind: 'waiting', reason: 'provider' };
      case 'fail':
        return { kind: 'failed', reason: decision.reason };
    }
  } catch (writeError) {
    if (writeError instanceof OwnershipLostError) return { kind: 'ownership-lost', reason: writeError.message };
    throw writeError;
  }
}

export async function settleUnitError(deps: RunnerDeps, claim: UnitClaim, error: PhaselineError, pending: FlushPayload): Promise<StepOutcome> {
  const { store } = deps;
  const nowMs = store.clock.now();
  const settled = await store.commitAsUnitOwner<SettledUnitError>(claim, async ({ tx, job, unit }) => {
    const decision = decideAfterError(unit, error, store.options, nowMs, deps.random);
    const lastError = { code: error.code, message: error.message, atMs: nowMs };
    const applied = applyClaimTally(unit, pending, claim.epoch);
    if (decision.action !== 'fail') {
      // A capped server delay holds only this unit back; its siblings go on, so it waits as a queued unit.
      const untilMs = decision.action === 'requeue' ? decision.nextRunAtMs : decision.untilMs;
      const message =
        decision.action === 'requeue'
          ? `${unit.unit}: attempt ${decision.attempts} failed (${error.code}: ${error.message})`
          : `${unit.unit}: ${error.message}: ${decision.reason}`;
      const transition = requeueUnit(applied.next, { attempts: decision.attempts, untilMs, message, kind: decision.action === 'requeue' ? 'retrying' : 'waiting', lastError }, nowMs);
      return {
        nextUnit: transition.next,
        events: [...applied.notes, ...transition.events],
        value: { kind: 'requeued' as const, dispatch: transition.dispatch, delayMs: untilMs - nowMs, attempts: decision.attempts },
      };
    }
    const reason = `unit ${unit.unit}: ${decision.reason}`;
    const failed = failJobForUnit(job, { reason, error: { code: error.code, message: `${unit.unit}: ${error.message}`, retryable: error.retryable, atMs: nowMs } }, nowMs);
    const ended = await endFanOutFromUnit(store, tx, job, { ...applied.next, status: 'queued', lease: null, lastError }, failed.next);
    return { ...ended, events: [...applied.notes, ...failed.events], value: { kind: 'failed' as const, reason } };
  });
  if (settled.kind === 'requeued') {
    await dispatchQuietly(deps, settled.dispatch);
    return { kind: 'requeued', attempts: settled.attempts, delayMs: settled.delayMs };
  }
  return settled;
}

export function failJobFromUnit(deps: RunnerDeps, claim: UnitClaim, error: TerminalError): Promise<StepOutcome> {
  return settleUnitError(deps, claim, error, EMPTY_FLUSH);
}

/**
 * The owner's spend cap stopped a model call: the job waits (reason `budget`) at the call's
 * boundary, spending no attempt. What the step recorded stays; the resumed step goes on from it.
 */
export async function waitAtSpendLimit(running: Running, owner: SectionOwner, reached: SpendLimitReachedError, pending: FlushPayload, notes: readonly EventDraft[]): Promise<StepOutcome> {
  const { store } = running.deps;
  const waiting = budgetWait({ message: reached.message, resetAtMs: reached.resetAtMs });
  running.deps.log?.('spend limit reached; the job waits', { spentUsd: reached.spentUsd, capUsd: reached.capUsd });
  try {
    if (owner.kind === 'unit') {
      await waitJobFromUnit(running.deps, owner.claim, waiting, pending, `${owner.claim.unit}: ${reached.message}`);
    } else {
      const nowMs = store.clock.now();
      await store.asOwner(owner.claim, ({ job }) => {
        const applied = applyClaimTally(job, pending, owner.claim.epoch);
        const transition = waitJob(applied.next, waiting, nowMs);
        return Promise.resolve({ next: transition.next, events: [...notes, ...applied.notes, ...transition.events], value: undefined });
      });
    }
    return { kind: 'waiting', reason: waiting.reason };
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    throw error;
  }
}

/**
 * A unit's step makes its whole job wait: the fan-out ends here (the unit back to queued), and on
 * resume it starts again, reusing finished units and recorded sections.
 */
export async function waitJobFromUnit(deps: RunnerDeps, claim: UnitClaim, waiting: JobWait, pending: FlushPayload, message: string): Promise<void> {
  const { store } = deps;
  await store.commitAsUnitOwner(claim, async ({ tx, job: current, unit: currentUnit }) => {
    const applied = applyClaimTally(currentUnit, pending, claim.epoch);
    const ended = await endFanOutFromUnit(store, tx, current, { ...applied.next, status: 'queued', lease: null }, waitJob(current, waiting, store.clock.now()).next);
    return { ...ended, events: [...applied.notes, { kind: 'waiting', message }], value: undefined };
  });
}
