import { logger } from 'firebase-functions';
import { onSchedule, type ScheduleFunction } from 'firebase-functions/v2/scheduler';
import { systemClock } from '../core/clock';
import { sweep, type SweepDeps } from '../engine/sweeper';
import { JobStore } from '../store/job-store';
import { firestore, stepQueue } from './admin';
import { engineOptionsFromEnv } from './config';
import type { Deployment } from './deployment';

/** The sweep's "now": the time the run was scheduled for (Cloud Scheduler's header), else the wall clock. */
export function scheduledNowMs(scheduleTime: string | undefined, fallback: () => number = Date.now): number {
  const parsed = scheduleTime === undefined ? Number.NaN : Date.parse(scheduleTime);
  return Number.isFinite(parsed) ? parsed : fallback();
}

/** The handler, apart from the trigger so tests call it with their own store and queue. */
export function sweepHandler(deps: () => SweepDeps): (event: { readonly scheduleTime?: string }) => Promise<void> {
  return async (event) => {
    const report = await sweep(deps(), scheduledNowMs(event.scheduleTime));
    const entry = { ...report, now: new Date(report.nowMs).toISOString() };
    if (report.errors > 0 || report.enqueueFailures > 0 || report.stoppedEffects.errors > 0) logger.warn('sweepJobs finished with failures', entry);
    else logger.info('sweepJobs finished', entry);
  };
}

/**
 * `sweepJobs` for these pipelines, every minute. Runs may overlap (a slow run and the next one):
 * every change is re-checked in its own transaction, so two sweeps never act on the same document twice.
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
