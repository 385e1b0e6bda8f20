/**
 * The soak's sweeper driver: the project's sweep rules with the Admin SDK against the emulators,
 * every couple of seconds instead of every minute, laid out as the deployed sweepJobs lays them out
 * (engine/sweep-minute.ts): rules 1 to 4 (leases, lost tasks, waits over) in one lane, one pass at a
 * time, and the slow part of a full sweep (stopped jobs' effects looked up at the receiver, then
 * retention) in a lane of its own, one at a time too, so that lookups against a receiver in an
 * outage never hold up a reclaim.
 *
 * A pass waits for its slowest document: a transaction left open by a killed worker or a cut
 * connection holds its read lock until the emulator expires it (about a minute), and any commit on
 * that document times out meanwhile, so such a pass can take a minute or more; the driver reports
 * those. (Overlapping passes were tried: each tries the same stuck document, and several
 * transactions that read one document and then want to write it only deadlock each other until
 * their lock waits time out.)
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
import { sweepEndedJobs, sweepRules, type EndedJobsReport, type RecoverySweepReport, type SweepDeps } from '../../functions/src/engine/sweeper';
import { notifyStoppedEffects } from '../../functions/src/pipelines/notify/config';
import { cloudTasksQueue } from '../../functions/src/store/cloud-tasks-queue';
import { JobStore } from '../../functions/src/store/job-store';
import { engineOptionsFromEnv } from '../../functions/src/triggers/config';

export interface SweeperStats {
  /** Passes of either lane (rules 1 to 4; stopped jobs' effects and retention). */
  readonly passes: number;
  readonly failedPasses: number;
  /** Passes that took longer than `slowMs`, and the longest, of either lane. */
  readonly slowPasses: number;
  readonly longestPassMs: number;
  /** The same for the rules lane alone: what a lost worker's recovery waits on. */
  readonly rulePasses: number;
  readonly slowRulePasses: number;
  readonly longestRulePassMs: number;
  readonly reclaimed: number;
  readonly unitsReclaimed: number;
  readonly quarantined: number;
  readonly redispatched: number;
  readonly resumed: number;
  /** Stopped jobs whose effects a pass checked with the receiver, and those it found settled. */
  readonly stoppedChecked: number;
  readonly stoppedSettled: number;
  /** Each pass slower than `slowMs`: when it started and how long it took (wall-clock ms). */
  readonly slow: readonly SlowPass[];
}

export interface SlowPass {
  readonly lane: 'rules' | 'ended';
  readonly startedMs: number;
  readonly tookMs: number;
}

export interface ChaosSweeper {
  /** Starts a rules pass now, or joins the one running, and resolves with its report (the timer starts ended-jobs passes). */
  runNow(): Promise<RecoverySweepReport>;
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
  const totals = {
    passes: 0,
    failedPasses: 0,
    slowPasses: 0,
    longestPassMs: 0,
    rulePasses: 0,
    slowRulePasses: 0,
    longestRulePassMs: 0,
    reclaimed: 0,
    unitsReclaimed: 0,
    quarantined: 0,
    redispatched: 0,
    resumed: 0,
    stoppedChecked: 0,
    stoppedSettled: 0,
  };
  const slow: SlowPass[] = [];
  /** Times a pass of either lane, counts it, and says when it was slow or failed. */
  const timed = <R>(lane: 'rules' | 'ended', startedMs: number, pass: Promise<R>, acted: (report: R) => string[]): Promise<R> =>
    pass.then(
      (report) => {
        const tookMs = Date.now() - startedMs;
        totals.passes += 1;
        totals.longestPassMs = Math.max(totals.longestPassMs, tookMs);
        if (lane === 'rules') {
          totals.rulePasses += 1;
          totals.longestRulePassMs = Math.max(totals.longestRulePassMs, tookMs);
        }
        const said = acted(report);
        if (tookMs > options.slowMs) {
          totals.slowPasses += 1;
          if (lane === 'rules') totals.slowRulePasses += 1;
          slow.push({ lane, startedMs, tookMs });
          const why = lane === 'rules' ? 'a document it needed was locked' : 'stopped jobs\' effects looked up at the receiver, or a locked document';
          options.log(`sweeper: a${lane === 'rules' ? '' : 'n ended-jobs'} pass took ${(tookMs / 1000).toFixed(1)} s (${why})${said.length > 0 ? `: ${said.join(', ')}` : ''}`);
        } else if (said.length > 0) {
          options.log(`sweeper: ${said.join(', ')}`);
        }
        return report;
      },
      (error: unknown) => {
        totals.failedPasses += 1;
        options.log(`sweeper: a${lane === 'rules' ? '' : 'n ended-jobs'} pass failed (${error instanceof Error ? error.message : String(error)})`);
        throw error;
      },
    );
  const actedOnRules = (report: RecoverySweepReport): string[] => {
    totals.reclaimed += report.reclaimed;
    totals.unitsReclaimed += report.unitsReclaimed;
    totals.quarantined += report.quarantined;
    totals.redispatched += report.redispatched + report.unitsRedispatched;
    totals.resumed += report.resumed;
    return ACTIONS.filter((key) => report[key] > 0).map((key) => `${key} ${report[key]}`);
  };
  const actedOnEnded = (report: EndedJobsReport): string[] => {
    totals.stoppedChecked += report.stoppedEffects.checked;
    totals.stoppedSettled += report.stoppedEffects.settled;
    return STOPPED_ACTIONS.filter((key) => report.stoppedEffects[key] > 0).map((key) => `stopped-job effects ${key} ${report.stoppedEffects[key]}`);
  };
  // One pass at a time per lane (maxInFlight: each lane's bound).
  const rulesInFlight = new Set<Promise<unknown>>();
  const endedInFlight = new Set<Promise<unknown>>();
  let current: Promise<RecoverySweepReport> | null = null;
  const track = (lane: Set<Promise<unknown>>, pass: Promise<unknown>): void => {
    lane.add(pass);
    void pass.catch(() => undefined).finally(() => lane.delete(pass));
  };
  const startEnded = (): void => {
    if (endedInFlight.size >= options.maxInFlight) return;
    const startedMs = Date.now();
    track(endedInFlight, timed('ended', startedMs, sweepEndedJobs(deps, startedMs), actedOnEnded));
  };
  const runNow = (): Promise<RecoverySweepReport> => {
    if (rulesInFlight.size >= options.maxInFlight) {
      if (current && rulesInFlight.has(current)) return current;
      return Promise.allSettled([...rulesInFlight]).then(runNow);
    }
    const startedMs = Date.now();
    const pass = timed('rules', startedMs, sweepRules(deps, startedMs), actedOnRules);
    current = pass;
    track(rulesInFlight, pass);
    return pass;
  };
  const settleStoppedAt = async (nowMs: number): Promise<SettleStoppedReport> => {
    // Registered before it waits, so the timer starts no ended-jobs pass meanwhile: one at a time in that lane.
    const previous = [...endedInFlight, ...rulesInFlight];
    const pass = Promise.allSettled(previous).then(() => settleStoppedEffects({ ...deps, log: (message) => options.log(`sweeper: ${message}`) }, nowMs));
    track(endedInFlight, pass);
    const report = await pass;
    totals.stoppedChecked += report.checked;
    totals.stoppedSettled += report.settled;
    return report;
  };
  const timer = setInterval(() => {
    startEnded();
    if (rulesInFlight.size < options.maxInFlight) void runNow().catch(() => undefined);
  }, options.everyMs);
  return {
    runNow,
    settleStoppedAt,
    stats: () => ({ ...totals, slow: [...slow] }),
    stop: async () => {
      clearInterval(timer);
      // A pass stuck on a locked document may take a minute; do not wait that long to stop.
      await Promise.race([Promise.allSettled([...rulesInFlight, ...endedInFlight]), new Promise((resolve) => setTimeout(resolve, 20_000).unref())]);
    },
  };
}
