import { logger } from 'firebase-functions';
import { onSchedule, type ScheduleFunction } from 'firebase-functions/v2/scheduler';
import { systemClock } from '../core/clock';
import { sweepMinute, type SweepMinuteDeps, type Wait } from '../engine/sweep-minute';
import type { RecoverySweepReport, SweepDeps } from '../engine/sweeper';
import { JobStore } from '../store/job-store';
import { firestore, stepQueue } from './admin';
import { engineOptionsFromEnv } from './config';
import type { Deployment } from './deployment';

/** The sweep's "now": the time the run was scheduled for (Cloud Scheduler's header), else the wall clock. */
export function scheduledNowMs(scheduleTime: string | undefined, fallback: () => number = Date.now): number {
  const parsed = scheduleTime === undefined ? Number.NaN : Date.parse(scheduleTime);
  return Number.isFinite(parsed) ? parsed : fallback();
}

/** A timer's wait, for the trigger's passes between full sweeps. */
const timerWait: Wait = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** What the recovery passes after a run's full sweep did, summed. */
function recoveryTotals(passes: readonly RecoverySweepReport[]) {
  const keys = ['reclaimed', 'unitsReclaimed', 'quarantined', 'redispatched', 'unitsRedispatched', 'skipped', 'enqueueFailures', 'errors', 'documentsRead'] as const;
  return Object.fromEntries(keys.map((key) => [key, passes.reduce((sum, pass) => sum + pass[key], 0)])) as Record<(typeof keys)[number], number>;
}

/**
 * The handler, apart from the trigger so tests call it with their own store and queue (and clock and
 * wait: by default the system clock and a timer). One run: a full sweep at the schedule time, then
 * recovery passes until its minute is over (engine/sweep-minute.ts).
 */
export function sweepHandler(deps: () => SweepDeps & Partial<Pick<SweepMinuteDeps, 'clock' | 'wait'>>): (event: { readonly scheduleTime?: string }) => Promise<void> {
  return async (event) => {
    const given = deps();
    const { full, recovery } = await sweepMinute({ clock: systemClock, wait: timerWait, ...given }, scheduledNowMs(event.scheduleTime));
    const recovered = recoveryTotals(recovery);
    const entry = { ...full, now: new Date(full.nowMs).toISOString(), recoveryPasses: recovery.length, recovered };
    if (full.errors > 0 || full.enqueueFailures > 0 || full.stoppedEffects.errors > 0 || recovered.errors > 0 || recovered.enqueueFailures > 0) logger.warn('sweepJobs finished with failures', entry);
    else logger.info('sweepJobs finished', entry);
  };
}

/**
 * `sweepJobs` for these pipelines: every minute, and within it every `sweepIntervalSeconds` for lost
 * workers and tasks. Runs may overlap (a slow last pass and the next run): every change is decided
 * again from a fresh read and committed conditioned on it, so two sweeps never act on the same
 * document twice.
 */
export function createSweepJobs(deployment: Deployment): ScheduleFunction {
  let deps: SweepDeps | undefined;
  // The same options as the step runner (engineOptionsFromEnv), so both agree on budgets and grace periods.
  const sweepDeps = (): SweepDeps =>
    (deps ??= {
      store: new JobStore(firestore(), systemClock, engineOptionsFromEnv()),
      queue: stepQueue(),
      log: (message, detail) => logger.warn(message, detail),
      // Stopped jobs' effects are checked through the adapter their pipeline declared (createPhaseline's effectsAfterStop).
      stoppedEffects: { settlerFor: deployment.settlerFor },
    });
  return onSchedule({ schedule: 'every 1 minutes', timeoutSeconds: 300, retryCount: 0 }, sweepHandler(sweepDeps));
}
