/**
 * A delivered task whose claim is not yet due (its job or unit is backing off, or its own step is
 * held by a worker not yet silent long enough to be taken over) waits for that moment in its own
 * request and tries the claim again, instead of asking Cloud Tasks for a redelivery: every failed
 * delivery doubles the queue's backoff for that task (2, 4, 8, 16 s ...), so a task that came early
 * twice could come back long after its job was due. The local tasks emulator ignores schedule
 * times, so there every scheduled task comes early.
 *
 * Safe: waiting writes nothing; the claim made after the wait is the same conditioned claim as any
 * other, and a holder that renewed meanwhile refuses it again. Bounded: the waiting is at most the
 * take-over age in all (a live holder's duplicate task holds its request that long, then asks for
 * a redelivery as before); a longer wait is left to the queue's schedule.
 */
import { realTimers } from '../../core/flusher';
import { takeoverAgeMs } from '../../core/options';
import type { RunnerDeps, StepOutcome } from './deps';
import { runStep } from './index';

/** The longest a task waits in its request, in all, for its claim to come due. */
export function dueWaitLimitMs(deps: Pick<RunnerDeps, 'store'>): number {
  return takeoverAgeMs(deps.store.options);
}

/** runStep, waiting in the request for a claim due within the limit; a `not-yet-due` answer is left only when the wait would pass it. */
export async function runStepWhenDue(deps: RunnerDeps, payload: unknown, limitMs = dueWaitLimitMs(deps)): Promise<StepOutcome> {
  const { clock } = deps.store;
  const timers = deps.timers ?? realTimers;
  const startedMs = clock.now();
  for (;;) {
    const outcome = await runStep(deps, payload);
    if (outcome.kind !== 'not-yet-due') return outcome;
    if (clock.now() - startedMs + outcome.retryAfterMs > limitMs) return outcome;
    await new Promise<void>((resolve) => timers.setTimeout(resolve, outcome.retryAfterMs));
  }
}
