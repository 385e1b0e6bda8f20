/**
 * One scheduled run of the sweeper. Cloud Scheduler fires at most once a minute, and a 20 s lease
 * wants a finer look than that: the run sweeps in full (every rule) at its schedule time, then looks
 * again for expired leases and lost tasks (sweepRecovery) every `sweepIntervalSeconds` until its
 * minute is over. Its recovery passes end before the next run's begin; its slow part may not (below).
 *
 * Pass k's "now" is the schedule time plus k intervals (the scheduler's time, never the wall clock),
 * and the run waits on its clock until then. A slot already behind the clock when its turn comes (a
 * pass that overran, a run delivered late) is skipped, never caught up: a run that starts after its
 * minute is over does its full sweep and nothing else. So the run never spins, and costs the same
 * whatever the number of jobs: one query per recovery rule per pass, each billed one read when it
 * finds nothing.
 *
 * The full sweep's slow part (rules 5 and 6: stopped jobs' effects looked up at their systems of
 * record, each lookup up to its adapter's deadline, then retention stamps) runs beside the recovery
 * passes, not in front of them: a backlog of lookups against a slow receiver never holds up the pass
 * that reclaims an expired lease (bug 46). It starts no further lookup after the run's last slot (a
 * late run: one interval after it began; the jobs left stay due for the next run), and the run ends
 * once it is done. A lookup already under way at the last slot runs to its own deadline, and
 * retention after it, so a run can still be settling when the next one starts, and both may look the
 * same stopped job up (a lookup changes nothing at the system of record). Both sides decide every
 * change from a fresh read and commit it conditioned on that read, so running them at once is as
 * safe as two overlapping runs: a job is settled by one commit, whichever lands first.
 */
import type { Clock } from '../core/clock';
import { sweepEndedJobs, sweepRecovery, sweepRules, type EndedJobsReport, type RecoverySweepReport, type SweepDeps, type SweepReport } from './sweeper';

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
  /** The full sweep at the schedule time (its stopped-effects and retention passes ran beside the recovery passes). */
  readonly full: SweepReport;
  /** The recovery passes after it, in order. */
  readonly recovery: readonly RecoverySweepReport[];
}

/** Runs the full sweep at `scheduledAtMs` (its slow part beside what follows), then recovery passes every interval until the minute from it is over. */
export async function sweepMinute(deps: SweepMinuteDeps, scheduledAtMs: number, periodMs: number = SCHEDULE_PERIOD_MS): Promise<SweepMinuteReport> {
  const intervalMs = deps.store.options.sweepIntervalSeconds * 1000;
  if (!(intervalMs > 0)) throw new Error(`sweepIntervalSeconds must be positive, got ${deps.store.options.sweepIntervalSeconds}`);
  const rules = await sweepRules(deps, scheduledAtMs);
  const recovery: RecoverySweepReport[] = [];
  // The last pass starts one interval before the next run's full sweep.
  const lastSlotMs = scheduledAtMs + periodMs - intervalMs;
  // Beside the passes below, bounded by the last of them (a run delivered after its slots still gets one interval of
  // lookups, else a run always late would settle nothing); its outcome, never a rejection left unheard, is awaited at the end.
  const untilMs = Math.max(lastSlotMs, deps.clock.now() + intervalMs);
  const ended: Promise<{ readonly report: EndedJobsReport } | { readonly error: unknown }> = sweepEndedJobs(deps, scheduledAtMs, { untilMs }).then(
    (report) => ({ report }),
    (error: unknown) => ({ error }),
  );
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
  const endedOutcome = await ended;
  if ('error' in endedOutcome) throw endedOutcome.error;
  const full: SweepReport = { ...rules, ...endedOutcome.report };
  return { full, recovery };
}
