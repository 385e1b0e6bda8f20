/**
 * A delivered task whose claim is not yet due (its job or unit is backing off, or its own step is
 * held by a worker not yet silent long enough to be taken over) waits for that moment in its own
 * request and tries the claim again, instead of asking Cloud Tasks for a redelivery: every failed
 * delivery doubles the queue's backoff for that task (2, 4, 8, 16 s ...), so a task that came early
 * twice could come back long after its job was due. The local tasks emulator ignores schedule
 * times, so there every scheduled task comes early.
 *
 * Safe: waiting writes nothing; the claim made after the wait is the same conditioned claim as any
 * other, and a holder that renewed meanwhile refuses it again. Bounded: the task waits only for a
 * claim due within the limit in all (the take-over age, less where the function's timeout leaves
 * less room beside the step budget), and looks again at least once a heartbeat and a second.
 *
 * A due time that moved later while the task waited means its claim is someone else's to run: the
 * holder renewed (it is alive), or another worker claimed the job and backed off again (and enqueued
 * the task for its new due time). Such a task is acknowledged, not sent back: Cloud Tasks would
 * deliver it again and again for as long as the holder works (up to 20 deliveries, the backoff
 * doubling to 300 s), and the local tasks emulator holds a dispatch slot through each of those
 * backoffs, starving new tasks. Nothing is lost: a live holder has its own task, and if it dies its
 * request fails (Cloud Tasks delivers that task again) or, frozen, its lease expires and the sweeper
 * reclaims it, as for any holder.
 */
import { realTimers } from '../../core/flusher';
import { takeoverAgeMs, type EngineOptions } from '../../core/options';
import { STEP_TIMEOUT_SECONDS } from '../../store/cloud-tasks-queue';
import type { RunnerDeps, StepOutcome } from './deps';
import { runStep } from './index';

/** What a delivery did: its outcome, how long it waited in its request, and how many claims it tried. */
export interface DueStepResult {
  readonly outcome: StepOutcome;
  readonly waitedMs: number;
  readonly claimTries: number;
}

/**
 * The longest a task waits in its request, in all, for its claim to come due: the take-over age,
 * and never more than a quarter of what the function's timeout leaves beside the step budget (the
 * budget counts from the claim, the timeout from the request).
 */
export function dueWaitLimitMs(options: Pick<EngineOptions, 'staleHeartbeatSeconds' | 'clockSkewSeconds' | 'stepBudgetSeconds'>): number {
  const roomMs = Math.max(0, STEP_TIMEOUT_SECONDS - options.stepBudgetSeconds) * 1000;
  return Math.min(takeoverAgeMs(options), Math.floor(roomMs / 4));
}

/** How long one wait lasts at most before the claim is tried again: a live holder shows its renewal within a heartbeat and a round trip. */
export function dueRecheckMs(options: Pick<EngineOptions, 'heartbeatSeconds'>): number {
  return options.heartbeatSeconds * 1000 + 1000;
}

/** Where a delivery stands in its wait: how long it waited, and when its claim should come due if its due time did not move (null before the first wait). */
export interface DueWaitState {
  readonly waitedMs: number;
  readonly expectedMs: number | null;
}

export const DUE_WAIT_START: DueWaitState = { waitedMs: 0, expectedMs: null };

/** What a delivery whose claim answered `retryAfterMs` does next: wait that long and try again, acknowledge (another worker's claim), or send the task back. */
export type DueWaitDecision =
  | { readonly action: 'wait'; readonly waitMs: number }
  | { readonly action: 'acknowledge'; readonly reason: string }
  | { readonly action: 'send-back' };

/** The wait's one rule, shared by the trigger's wait and the bench's model of it. Pure. */
export function decideDueWait(state: DueWaitState, retryAfterMs: number, options: Pick<EngineOptions, 'heartbeatSeconds'>, limitMs: number): DueWaitDecision {
  if (state.expectedMs !== null && retryAfterMs > state.expectedMs) {
    const reason = `its claim is another worker's to run: its due time moved ${retryAfterMs - state.expectedMs} ms later while this task waited ${state.waitedMs} ms (the holder renewed, or the job was claimed and backed off again)`;
    return { action: 'acknowledge', reason };
  }
  if (state.waitedMs + retryAfterMs > limitMs) return { action: 'send-back' };
  return { action: 'wait', waitMs: Math.min(retryAfterMs, dueRecheckMs(options)) };
}

/** The state after a wait of `waitMs` that took `tookMs` by the clock, for a claim that answered `retryAfterMs` before it. Counted as at least the wait asked for: a clock set back cannot stretch the limit. */
export function afterDueWait(state: DueWaitState, retryAfterMs: number, waitMs: number, tookMs = waitMs): DueWaitState {
  const counted = Math.max(waitMs, tookMs);
  return { waitedMs: state.waitedMs + counted, expectedMs: retryAfterMs - counted };
}

/** runStep, waiting in the request for a claim due within the limit; a `not-yet-due` answer is left only when the wait would pass it. */
export async function runStepWhenDue(deps: RunnerDeps, payload: unknown, limitMs = dueWaitLimitMs(deps.store.options)): Promise<DueStepResult> {
  const { clock, options } = deps.store;
  const timers = deps.timers ?? realTimers;
  // Each wait but the last lasts a whole recheck interval: the tries are bounded whatever the clock does.
  const maxClaimTries = Math.ceil(limitMs / dueRecheckMs(options)) + 2;
  let state = DUE_WAIT_START;
  for (let claimTries = 1; ; claimTries += 1) {
    const outcome = await runStep(deps, payload);
    const { waitedMs } = state;
    if (outcome.kind !== 'not-yet-due' || claimTries >= maxClaimTries) return { outcome, waitedMs, claimTries };
    const decision = decideDueWait(state, outcome.retryAfterMs, options, limitMs);
    if (decision.action === 'acknowledge') return { outcome: { kind: 'not-claimable', reason: decision.reason }, waitedMs, claimTries };
    if (decision.action === 'send-back') return { outcome, waitedMs, claimTries };
    const before = clock.now();
    await new Promise<void>((resolve) => timers.setTimeout(resolve, decision.waitMs));
    state = afterDueWait(state, outcome.retryAfterMs, decision.waitMs, clock.now() - before);
  }
}
