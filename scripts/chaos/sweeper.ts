/**
 * The soak's sweeper driver: the project's `sweep()` with the Admin SDK against the emulators
 * (the same call the deployed `sweepJobs` makes), every couple of seconds instead of every minute.
 *
 * One pass at a time, as the scheduler runs it. A pass waits for its slowest document: a
 * transaction left open by a killed worker or a cut connection holds its read lock until the
 * emulator expires it (about a minute), and any commit on that document times out meanwhile, so
 * such a pass can take a minute or more; the driver reports those. (Overlapping passes were tried:
 * each tries the same stuck document, and several transactions that read one document and then
 * want to write it only deadlock each other until their lock waits time out.)
 *
 * As the deployed sweepJobs, it settles stopped jobs' effects with the receiver the notify jobs
 * send through (PHASELINE_RECEIVER_URL in this process's environment). At the end of a run,
 * `settleStoppedAt` runs that pass alone at a later "now", so that every stopped job is past its
 * grace period without the soak waiting for it.
 */
import type { App } from 'firebase-admin/app';
import type { Firestore } from 'firebase-admin/firestore';
import { systemClock } from '../../functions/src/core/clock';
import { settleStoppedEffects, type SettleStoppedReport } from '../../functions/src/engine/settle-stopped';
import { sweep, type SweepDeps, type SweepReport } from '../../functions/src/engine/sweeper';
import { notifyStoppedEffects } from '../../functions/src/pipelines/notify/config';
import { cloudTasksQueue } from '../../functions/src/store/cloud-tasks-queue';
import { JobStore } from '../../functions/src/store/job-store';
import { engineOptionsFromEnv } from '../../functions/src/triggers/config';

export interface SweeperStats {
  readonly passes: number;
  readonly failedPasses: number;
  /** Passes that took longer than `slowMs`. */
  readonly slowPasses: number;
  readonly longestPassMs: number;
  readonly reclaimed: number;
  readonly unitsReclaimed: number;
  readonly quarantined: number;
  readonly redispatched: number;
  readonly resumed: number;
  /** Stopped jobs whose effects a pass checked with the receiver, and those it found settled. */
  readonly stoppedChecked: number;
  readonly stoppedSettled: number;
}

export interface ChaosSweeper {
  /** Starts a pass now, or joins the one running when `maxInFlight` are, and resolves with its report. */
  runNow(): Promise<SweepReport>;
  /** Runs the stopped-effects pass alone at `nowMs`, after the pass in flight (if any), and resolves with its report. */
  settleStoppedAt(nowMs: number): Promise<SettleStoppedReport>;
  stats(): SweeperStats;
  stop(): Promise<void>;
}

const ACTIONS = ['reclaimed', 'unitsReclaimed', 'quarantined', 'redispatched', 'unitsRedispatched', 'resumed', 'parkedUnits', 'errors', 'enqueueFailures'] as const;
const STOPPED_ACTIONS = ['checked', 'settled', 'pending', 'errors'] as const;

export function startChaosSweeper(options: {
  readonly app: App;
  readonly db: Firestore;
  readonly everyMs: number;
  readonly maxInFlight: number;
  readonly slowMs: number;
  readonly log: (line: string) => void;
}): ChaosSweeper {
  const deps: SweepDeps = {
    store: new JobStore(options.db, systemClock, engineOptionsFromEnv()),
    queue: cloudTasksQueue(options.app),
    log: () => undefined,
    stoppedEffects: { settlerFor: notifyStoppedEffects() },
  };
  const inFlight = new Set<Promise<unknown>>();
  const totals = {
    passes: 0,
    failedPasses: 0,
    slowPasses: 0,
    longestPassMs: 0,
    reclaimed: 0,
    unitsReclaimed: 0,
    quarantined: 0,
    redispatched: 0,
    resumed: 0,
    stoppedChecked: 0,
    stoppedSettled: 0,
  };
  let current: Promise<SweepReport> | null = null;
  const runNow = (): Promise<SweepReport> => {
    if (inFlight.size >= options.maxInFlight) {
      if (current && inFlight.has(current)) return current;
      // The pass in flight is the stopped-effects one: a sweep after it.
      return Promise.allSettled([...inFlight]).then(runNow);
    }
    const startedMs = Date.now();
    const pass = sweep(deps, startedMs).then(
      (report) => {
        const tookMs = Date.now() - startedMs;
        totals.passes += 1;
        totals.longestPassMs = Math.max(totals.longestPassMs, tookMs);
        totals.reclaimed += report.reclaimed;
        totals.unitsReclaimed += report.unitsReclaimed;
        totals.quarantined += report.quarantined;
        totals.redispatched += report.redispatched + report.unitsRedispatched;
        totals.resumed += report.resumed;
        totals.stoppedChecked += report.stoppedEffects.checked;
        totals.stoppedSettled += report.stoppedEffects.settled;
        const acted = [
          ...ACTIONS.filter((key) => report[key] > 0).map((key) => `${key} ${report[key]}`),
          ...STOPPED_ACTIONS.filter((key) => report.stoppedEffects[key] > 0).map((key) => `stopped-job effects ${key} ${report.stoppedEffects[key]}`),
        ];
        if (tookMs > options.slowMs) {
          totals.slowPasses += 1;
          options.log(`sweeper: a pass took ${(tookMs / 1000).toFixed(1)} s (a document it needed was locked)${acted.length > 0 ? `: ${acted.join(', ')}` : ''}`);
        } else if (acted.length > 0) {
          options.log(`sweeper: ${acted.join(', ')}`);
        }
        return report;
      },
      (error: unknown) => {
        totals.failedPasses += 1;
        options.log(`sweeper: a pass failed (${error instanceof Error ? error.message : String(error)})`);
        throw error;
      },
    );
    current = pass;
    inFlight.add(pass);
    void pass.catch(() => undefined).finally(() => inFlight.delete(pass));
    return pass;
  };
  const settleStoppedAt = async (nowMs: number): Promise<SettleStoppedReport> => {
    // Registered before it waits, so the timer starts no pass meanwhile: one pass at a time.
    const previous = [...inFlight];
    const pass = Promise.allSettled(previous).then(() => settleStoppedEffects({ ...deps, log: (message) => options.log(`sweeper: ${message}`) }, nowMs));
    inFlight.add(pass);
    void pass.catch(() => undefined).finally(() => inFlight.delete(pass));
    const report = await pass;
    totals.stoppedChecked += report.checked;
    totals.stoppedSettled += report.settled;
    return report;
  };
  const timer = setInterval(() => {
    if (inFlight.size < options.maxInFlight) void runNow().catch(() => undefined);
  }, options.everyMs);
  return {
    runNow,
    settleStoppedAt,
    stats: () => ({ ...totals }),
    stop: async () => {
      clearInterval(timer);
      // A pass stuck on a locked document may take a minute; do not wait that long to stop.
      await Promise.race([Promise.allSettled([...inFlight]), new Promise((resolve) => setTimeout(resolve, 20_000).unref())]);
    },
  };
}
