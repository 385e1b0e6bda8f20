/**
 * One scheduled run of the sweeper. Cloud Scheduler fires at most once a minute, and a 20 s lease
 * wants a finer look than that: the run sweeps in full (every rule) at its schedule time, then looks
 * again for expired leases and lost tasks (sweepRecovery) every `sweepIntervalSeconds` until its
 * minute is over, and returns before the next run is due.
 *
 * Pass k's "now" is the schedule time plus k intervals (the scheduler's time, never the wall clock),
 * and the run waits on its clock until then. A slot already behind the clock when its turn comes (a
 * pass that overran, a run delivered late) is skipped, never caught up: a run that starts after its
 * minute is over does its full sweep and nothing else. So the run never spins, and costs the same
 * whatever the number of jobs: one query per recovery rule per pass, each billed one read when it
 * finds nothing.
 */
import type { Clock } from '../core/clock';
import { sweep, sweepRecovery, type RecoverySweepReport, type SweepDeps, type SweepReport } from './sweeper';

/** Cloud Scheduler's shortest period, and the schedule `sweepJobs` runs on. */
export const SCHEDULE_PERIOD_MS = 60_000;

/** Waits about `ms` milliseconds (a timer in the trigger; the test's clock in tests). */
export type Wait = (ms: number) => Promise<void>;

export interface SweepMinuteDeps extends SweepDeps {
  /** The clock the run waits on between passes. */
  readonly clock: Clock;
  readonly wait: Wait;
}

export interface SweepMinuteReport {
  /** The full sweep at the schedule time. */
  readonly full: SweepReport;
  /** The recovery passes after it, in order. */
  readonly recovery: readonly RecoverySweepReport[];
}

/** Runs the full sweep at `scheduledAtMs`, then recovery passes every interval until the minute from it is over. */
export async function sweepMinute(deps: SweepMinuteDeps, scheduledAtMs: number, periodMs: number = SCHEDULE_PERIOD_MS): Promise<SweepMinuteReport> {
  const intervalMs = deps.store.options.sweepIntervalSeconds * 1000;
  if (!(intervalMs > 0)) throw new Error(`sweepIntervalSeconds must be positive, got ${deps.store.options.sweepIntervalSeconds}`);
  const full = await sweep(deps, scheduledAtMs);
  const recovery: RecoverySweepReport[] = [];
  // The last pass starts one interval before the next run's full sweep.
  const lastSlotMs = scheduledAtMs + periodMs - intervalMs;
  let slotMs = scheduledAtMs + intervalMs;
  while (slotMs <= lastSlotMs) {
    const nowMs = deps.clock.now();
    if (nowMs > slotMs) {
      // Behind: the next slot not yet past (every slot in between is skipped).
      slotMs = scheduledAtMs + Math.ceil((nowMs - scheduledAtMs) / intervalMs) * intervalMs;
      continue;
    }
    if (slotMs > nowMs) await deps.wait(slotMs - nowMs);
    // A timer that fired early decides at its own time, never ahead of it.
    recovery.push(await sweepRecovery(deps, Math.min(slotMs, deps.clock.now())));
    slotMs += intervalMs;
  }
  return { full, recovery };
}
