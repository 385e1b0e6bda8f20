import { DEFAULT_MAX_SERVER_DELAY_SECONDS } from './server-delay';

/** Every engine setting, with units in the names, resolved once from one defaults object. */
export interface EngineOptions {
  /** A lease nobody renews expires this long after its last renewal: the sweeper's backstop. */
  readonly leaseSeconds: number;
  /**
   * How often, within each scheduled minute, the sweeper looks for expired leases and lost tasks
   * (Cloud Scheduler fires at most once a minute; the run sweeps again at this interval until its
   * minute is over). A frozen worker's job is reclaimed at most `leaseSeconds + sweepIntervalSeconds`
   * after its last renewal.
   */
  readonly sweepIntervalSeconds: number;
  /** How often a working step renews its lease (coalesced with progress writes). */
  readonly heartbeatSeconds: number;
  /**
   * A holder silent this long starts nothing more, and a task that finds its own step held by a
   * worker silent this long plus `clockSkewSeconds` takes the job (or unit) over at once with a new
   * epoch: a redelivered task after a crash recovers in seconds instead of waiting for the lease
   * and the sweeper. Younger: redeliver later.
   */
  readonly staleHeartbeatSeconds: number;
  /**
   * The most two instances' clocks may differ. A taker measures a holder's silence on its own clock
   * from the renewal time the holder stamped on its clock, so a redelivered task takes over only
   * this much after the holder's stop age (`takeoverAgeMs`, `holderStopAgeMs`): a taker whose clock
   * is ahead by up to this much still finds the holder stopped.
   */
  readonly clockSkewSeconds: number;
  /**
   * A step renews its lease only while it shows progress (a model or tool call came back, a
   * section or transcript was recorded, cost or progress reported) at least this often. A wedged
   * step stops renewing, gives its job back (counted as a lost worker) and lets it be reclaimed.
   * Keep it above the longest single model or tool call.
   */
  readonly progressTimeoutSeconds: number;
  /** Minimum gap between two coalesced progress writes to the job document. */
  readonly progressFlushMs: number;
  /** A step stops starting new sections once this much of its time is used. */
  readonly stepBudgetSeconds: number;
  /** Caught errors a job may have before it fails. */
  readonly maxAttempts: number;
  /** Expired leases a job may have before it is quarantined. */
  readonly maxStaleReclaims: number;
  readonly backoffBaseSeconds: number;
  readonly backoffMaxSeconds: number;
  /** A queued job whose task has not claimed it this long after nextRunAt is re-dispatched. */
  readonly lostTaskGraceSeconds: number;
  /** Documents the sweeper handles per query per run. */
  readonly sweepBatchSize: number;
  /** In-call retries of a Firestore write before the step gives up on it. */
  readonly writeRetries: number;
  /**
   * Cap on any delay a server asks for (`Retry-After`). A longer one is treated as an outage: the
   * job waits with a stated resume time this far ahead instead of parking for what the server said.
   */
  readonly maxServerDelaySeconds: number;
  /**
   * Days an ended job's transcripts, events and artifacts (and a rejected task) are kept: they get
   * `expireAt` this long after the job ended (or the task was rejected), and Firestore's TTL
   * policies delete them after that. The job document and its published answer stay.
   */
  readonly retentionDays: number;
}

/** The furthest ahead Cloud Tasks schedules a task: 30 days. */
export const MAX_SCHEDULE_SECONDS = 30 * 86_400;

export const DEFAULT_ENGINE_OPTIONS: EngineOptions = {
  // The sweeper's backstop for a holder whose task never comes back (a frozen worker, a lost task).
  // Its floor is the stale-takeover age plus a margin: a holder that confirmed no renewal for
  // holderStopAgeMs (10 s here) stops itself (core/lease-guard.ts), so at expiry it has started
  // nothing for 10 s. No transaction a dead client could leave open sits on a lease holder's
  // documents (README: Recovery).
  leaseSeconds: 20,
  // 20 s lease + 5 s: a frozen worker's job is reclaimed within 25 s of its last renewal, claimed again about a second later.
  sweepIntervalSeconds: 5,
  // Cloud Tasks redelivers a killed step 2, 6 and 14 s after the kill: a holder silent 12 s (takeoverAgeMs) is taken over by the third.
  heartbeatSeconds: 5,
  staleHeartbeatSeconds: 10,
  // A holder stops at 10 s of silence, a redelivered task takes over at 10 + 2 = 12 s (holderStopAgeMs): a live holder renewed every 5 s keeps 5 s for a renewal's round trip and its retry.
  clockSkewSeconds: 2,
  progressTimeoutSeconds: 150,
  progressFlushMs: 1_000,
  stepBudgetSeconds: 300,
  maxAttempts: 5,
  maxStaleReclaims: 3,
  backoffBaseSeconds: 5,
  backoffMaxSeconds: 600,
  // A queued job's task may wait behind others (the queue's rate and concurrency limits): a redispatch then only adds a task that acknowledges.
  lostTaskGraceSeconds: 20,
  sweepBatchSize: 200,
  writeRetries: 3,
  maxServerDelaySeconds: DEFAULT_MAX_SERVER_DELAY_SECONDS,
  retentionDays: 30,
};

export function resolveEngineOptions(overrides: Partial<EngineOptions> = {}): EngineOptions {
  const options = { ...DEFAULT_ENGINE_OPTIONS, ...overrides };
  for (const [name, value] of Object.entries(options)) {
    if (!Number.isFinite(value) || value < 0) throw new Error(`Engine option ${name} must be a non-negative number, got ${value}`);
  }
  if (options.heartbeatSeconds >= options.leaseSeconds) {
    throw new Error(`heartbeatSeconds (${options.heartbeatSeconds}) must be shorter than leaseSeconds (${options.leaseSeconds})`);
  }
  if (options.staleHeartbeatSeconds < 2 * options.heartbeatSeconds) {
    throw new Error(`staleHeartbeatSeconds (${options.staleHeartbeatSeconds}) must be at least two heartbeats (${2 * options.heartbeatSeconds} s): one late heartbeat is not a dead worker`);
  }
  // A live holder must outlast one failed renewal (tried again at most a heartbeat later), as a taker must.
  if (holderStopAgeMs(options) < 2 * options.heartbeatSeconds * 1000) {
    throw new Error(
      `the holder's stop age (the shorter of staleHeartbeatSeconds ${options.staleHeartbeatSeconds} s and leaseSeconds ${options.leaseSeconds} s less clockSkewSeconds ${options.clockSkewSeconds} s) ` +
        `must be at least two heartbeats (${2 * options.heartbeatSeconds} s): a live holder would stop itself after one late renewal`,
    );
  }
  if (options.sweepIntervalSeconds <= 0 || options.sweepIntervalSeconds > 60) {
    throw new Error(`sweepIntervalSeconds must be more than 0 and at most 60 (the scheduler's minute), got ${options.sweepIntervalSeconds}`);
  }
  if (options.progressTimeoutSeconds <= options.heartbeatSeconds) {
    throw new Error(`progressTimeoutSeconds (${options.progressTimeoutSeconds}) must be longer than heartbeatSeconds (${options.heartbeatSeconds})`);
  }
  // Delays that reach a Firestore timestamp or a Cloud Tasks schedule must stay within what those
  // accept: Cloud Tasks schedules at most 30 days ahead.
  for (const name of ['maxServerDelaySeconds', 'backoffBaseSeconds', 'backoffMaxSeconds', 'leaseSeconds'] as const) {
    if (options[name] > MAX_SCHEDULE_SECONDS) throw new Error(`Engine option ${name} must be at most ${MAX_SCHEDULE_SECONDS} s (30 days), got ${options[name]}`);
  }
  if (options.retentionDays <= 0) throw new Error(`retentionDays must be positive (a TTL of none would delete a job's timeline as it ends), got ${options.retentionDays}`);
  return options;
}

/**
 * How long a holder may go without a confirmed renewal before it starts nothing more
 * (core/lease-guard.ts): the stale-heartbeat age, or less when the lease is that short. Both sides
 * measure from the renewal time the holder stamped on its own clock before sending it; a taker
 * measures on its own clock. A redelivered task takes the claim over only at `takeoverAgeMs` (the
 * stale age plus `clockSkewSeconds`), and the sweeper only once the lease has run out, at least
 * `clockSkewSeconds` past this age: so a taker whose clock is at most that far ahead finds the
 * holder already stopped. The allowance is paid by the taker, not the holder: a live holder keeps
 * the whole stale age for its renewals.
 */
export function holderStopAgeMs(options: Pick<EngineOptions, 'staleHeartbeatSeconds' | 'leaseSeconds' | 'clockSkewSeconds'>): number {
  return Math.min(options.staleHeartbeatSeconds, options.leaseSeconds - options.clockSkewSeconds) * 1000;
}

/** The silence after which a redelivered task takes a claim over: the holder's stop age plus the clock skew allowance (holderStopAgeMs). */
export function takeoverAgeMs(options: Pick<EngineOptions, 'staleHeartbeatSeconds' | 'clockSkewSeconds'>): number {
  return (options.staleHeartbeatSeconds + options.clockSkewSeconds) * 1000;
}
