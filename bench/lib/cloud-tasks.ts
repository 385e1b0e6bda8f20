/**
 * What the platform does around the engine, as this project deploys it: the step queue's retry
 * rules, rate limits and function timeout, and the sweeper's schedule. They are read from the
 * exported triggers' own manifests (`runJobStep.__endpoint`, `sweepJobs.__endpoint`, as
 * firebase-tools reads them at deploy), so the bench follows functions/src/triggers/ when the
 * settings there change instead of keeping a copy. Loading the triggers connects nothing: their
 * backends are created on first use.
 */
import { runJobStep, sweepJobs } from '../../functions/src';

function numberSetting(value: unknown, name: string): number {
  if (typeof value !== 'number' || !Number.isFinite(value)) throw new Error(`bench: runJobStep's ${name} is not a plain number (${String(value)}); the bench cannot model it`);
  return value;
}

const retry = runJobStep.__endpoint.taskQueueTrigger?.retryConfig ?? {};
const rates = runJobStep.__endpoint.taskQueueTrigger?.rateLimits ?? {};

/** The step queue as configured in functions/src/triggers/run-job-step.ts (the deployed runJobStep). */
export const STEP_QUEUE = {
  minBackoffSeconds: numberSetting(retry.minBackoffSeconds, 'retryConfig.minBackoffSeconds'),
  maxBackoffSeconds: numberSetting(retry.maxBackoffSeconds, 'retryConfig.maxBackoffSeconds'),
  maxDoublings: numberSetting(retry.maxDoublings, 'retryConfig.maxDoublings'),
  /** Deliveries in all, the first one included. */
  maxAttempts: numberSetting(retry.maxAttempts, 'retryConfig.maxAttempts'),
  maxDispatchesPerSecond: numberSetting(rates.maxDispatchesPerSecond, 'rateLimits.maxDispatchesPerSecond'),
  maxConcurrentDispatches: numberSetting(rates.maxConcurrentDispatches, 'rateLimits.maxConcurrentDispatches'),
  /**
   * The function's timeout: a request whose worker froze (a paused instance, a partition) is
   * answered with an error only then, and Cloud Tasks retries it after that.
   */
  timeoutSeconds: numberSetting(runJobStep.__endpoint.timeoutSeconds, 'timeoutSeconds'),
} as const;

/**
 * Cloud Tasks' ceiling on dispatches per second for one queue, whatever the queue's own setting
 * (documented under Cloud Tasks quotas and limits: "Maximum rate of dispatches per queue: 500").
 */
export const CLOUD_TASKS_MAX_DISPATCHES_PER_QUEUE = 500;

/**
 * Cloud Tasks' wait before delivery number `failures + 1` of a task whose delivery `failures`
 * failed: the interval starts at minBackoff, doubles maxDoublings times, then grows linearly by
 * the last doubled interval, never beyond maxBackoff (the rule documented for queue RetryConfig).
 * With this project's settings: 2, 4, 8, 16, 32, ... s.
 */
export function redeliveryDelayMs(failures: number): number {
  const retryNumber = Math.max(1, failures);
  const { minBackoffSeconds, maxBackoffSeconds, maxDoublings } = STEP_QUEUE;
  const seconds =
    retryNumber - 1 <= maxDoublings ? minBackoffSeconds * 2 ** (retryNumber - 1) : minBackoffSeconds * 2 ** maxDoublings * (retryNumber - maxDoublings);
  return Math.min(maxBackoffSeconds, seconds) * 1000;
}

/** The sweeper's period, from its schedule (`every N minutes`). */
export const SWEEP_PERIOD_MS = ((): number => {
  const schedule = sweepJobs.__endpoint.scheduleTrigger?.schedule;
  const match = typeof schedule === 'string' ? /^every (\d+) minutes?$/.exec(schedule.trim()) : null;
  if (!match) throw new Error(`bench: sweepJobs' schedule ${JSON.stringify(schedule)} is not "every N minutes"; the bench cannot model it`);
  return Number(match[1]) * 60_000;
})();

/**
 * The sweeper's next pass strictly after `afterMs`: each scheduled run sweeps in full at the start of
 * its period, then runs the recovery rules every `intervalMs` until one interval before the next run
 * (functions/src/engine/sweep-minute.ts). `full` says which kind of pass it is.
 */
export function nextSweepPass(afterMs: number, intervalMs: number, periodMs: number = SWEEP_PERIOD_MS): { readonly atMs: number; readonly full: boolean } {
  if (!(intervalMs > 0)) throw new Error(`bench: sweep interval must be positive, got ${intervalMs}`);
  const periodStartMs = Math.floor(afterMs / periodMs) * periodMs;
  const slot = Math.floor((afterMs - periodStartMs) / intervalMs) + 1;
  if (slot * intervalMs <= periodMs - intervalMs) return { atMs: periodStartMs + slot * intervalMs, full: false };
  return { atMs: periodStartMs + periodMs, full: true };
}
