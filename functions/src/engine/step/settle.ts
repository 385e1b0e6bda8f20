/** Settling what a step could not finish: a caught error (requeue, capped outage wait, fail), a stalled step giving its job back, and the same for units. */
import { OwnershipLostError, PhaselineError, SpendLimitReachedError, TerminalError } from '../../core/errors';
import { applyClaimTally, EMPTY_FLUSH, type FlushPayload } from '../../core/flusher';
import { type JobRecord, type JobWait } from '../../core/job';
import { budgetWait, decideAfterError } from '../../core/lifecycle';
import { giveBackJob, giveBackUnit, settleJobError, requeueUnit, waitJob, type Dispatch } from '../../core/transitions';
import { type UnitRecord } from '../../store/codec';
import type { EventDraft, JobClaim, UnitClaim } from '../../store/job-store';
import { NoProgressError, RunnerDeps, Running, SectionOwner, StepOutcome, chargeUnit, dispatchQuietly, lost } from './running';

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
    const given = await store.commitAsUnitOwner(claim, ({ job, unit }) => {
      const applied = applyClaimTally(unit, pending, claim.epoch);
      const transition = giveBackUnit(applied.next, { why: stall.message, options: store.options }, nowMs);
      if (transition.quarantine !== undefined) {
        const charged = chargeUnit(job, transition.next);
        return Promise.resolve({
          next: { ...charged.job, status: 'quarantined' as const, lease: null, quarantine: { reason: transition.quarantine, atMs: nowMs }, finishedAtMs: nowMs },
          nextUnit: charged.unit,
          events: [...applied.notes, ...transition.events],
          value: undefined,
        });
      }
      return Promise.resolve({ nextUnit: transition.next, events: [...applied.notes, ...transition.events], value: transition.dispatch });
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
  const settled = await store.commitAsUnitOwner<SettledUnitError>(claim, ({ job, unit }) => {
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
      return Promise.resolve({
        nextUnit: transition.next,
        events: [...applied.notes, ...transition.events],
        value: { kind: 'requeued' as const, dispatch: transition.dispatch, delayMs: untilMs - nowMs, attempts: decision.attempts },
      });
    }
    const reason = `unit ${unit.unit}: ${decision.reason}`;
    const charged = chargeUnit(job, applied.next);
    const next: JobRecord = {
      ...charged.job,
      status: 'failed',
      fanout: null,
      lease: null,
      finishedAtMs: nowMs,
      lastError: { code: error.code, message: `${unit.unit}: ${error.message}`, retryable: error.retryable, atMs: nowMs },
    };
    const nextUnit: UnitRecord = { ...charged.unit, status: 'queued', lease: null, lastError };
    return Promise.resolve({ next, nextUnit, events: [...applied.notes, { kind: 'failed', message: `Failed: ${reason}. Last error: ${error.message}` }], value: { kind: 'failed' as const, reason } });
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
  await store.commitAsUnitOwner(claim, ({ job: current, unit: currentUnit }) => {
    const applied = applyClaimTally(currentUnit, pending, claim.epoch);
    const charged = chargeUnit(current, applied.next);
    return Promise.resolve({
      next: { ...charged.job, status: 'waiting' as const, fanout: null, lease: null, step: current.step + 1, dispatch: 0, waiting, nextRunAtMs: waiting.untilMs ?? store.clock.now() },
      nextUnit: { ...charged.unit, status: 'queued' as const, lease: null },
      events: [...applied.notes, { kind: 'waiting', message }],
      value: undefined,
    });
  });
}
