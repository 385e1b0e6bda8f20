/**
 * What a soak run will do, decided from the seed before anything starts: the jobs (pipeline and
 * input), the fault schedule (when, which kind, with which parameters), the provider error waves
 * (which must be fixed when the functions start: they read them from PHASELINE_OFFLINE_SETTINGS)
 * and the engine settings. Pure, so a seed can be inspected and tested without a stack.
 *
 * Which job or process a fault hits is drawn at the moment it fires, from the seed's target
 * stream, among what is running then: the schedule replays exactly, the interleaving cannot.
 */
import { Rng } from './random';

export type Pipeline = 'research' | 'notify' | 'canary';

export interface JobPlan {
  readonly index: number;
  readonly pipeline: Pipeline;
  readonly input: Readonly<Record<string, unknown>>;
  readonly idempotencyKey: string;
  /** Which of the run's users submits it. */
  readonly user: number;
  /** The client sends the same request (same Idempotency-Key) a second time, as after a timeout. */
  readonly resubmit: boolean;
  /**
   * The owner cancels it while it sends (a notify job in its send phase), so that it may stop with
   * effects in flight: what the check of stopped jobs' effects needs to see.
   */
  readonly cancelMidSend: boolean;
}

export type ReceiverOutageMode = 'unavailable' | 'refused' | 'apply-then-hang' | 'fail-before-apply' | 'drop-connection' | 'hang-and-lookups-fail';

export type FaultSpec =
  | { readonly kind: 'worker-kill' }
  | { readonly kind: 'lease-expiry' }
  | { readonly kind: 'duplicate-delivery'; readonly staleStep: boolean }
  | { readonly kind: 'receiver-outage'; readonly mode: ReceiverOutageMode; readonly durationMs: number; readonly times: number }
  /** `stall`: the emulator's JVM stopped (SIGSTOP) then continued; `cut`: every connection to it reset, new ones refused. */
  | { readonly kind: 'checkpoint-write-failure'; readonly mode: 'stall' | 'cut'; readonly durationMs: number }
  /** The worker holding a live lease stopped (SIGSTOP) for longer than the lease, then continued. */
  | { readonly kind: 'worker-freeze'; readonly durationMs: number }
  | { readonly kind: 'task-loss' }
  /** Answers to a lease holder's Firestore requests dropped until one of its commits lands, then its connections reset. */
  | { readonly kind: 'commit-answer-lost' }
  /** The functions reloaded while steps run; `freeze` of the old workers busy with a step are stopped first, and continued after `frozenMs`. */
  | { readonly kind: 'rolling-deploy'; readonly freeze: number; readonly frozenMs: number };

export type FaultKind = FaultSpec['kind'] | 'provider-wave' | 'submit-retry' | 'owner-cancel';

export const FAULT_KINDS: readonly FaultKind[] = [
  'worker-kill',
  'worker-freeze',
  'task-loss',
  'commit-answer-lost',
  'rolling-deploy',
  'lease-expiry',
  'provider-wave',
  'receiver-outage',
  'checkpoint-write-failure',
  'duplicate-delivery',
  'submit-retry',
  'owner-cancel',
];

/** Share of notify jobs their owner cancels mid-send. */
const CANCEL_SHARE = 0.35;

export interface ScheduledFault {
  /** Milliseconds after the fault clock starts (when the first job is seen running). */
  readonly atMs: number;
  readonly spec: FaultSpec;
}

export interface ErrorWave {
  /** Milliseconds after the offline settings' epoch (the stack's launch). */
  readonly startMs: number;
  readonly endMs: number;
  readonly status: 429 | 503;
  readonly retryAfterMs?: number;
}

export interface RunPlan {
  readonly seed: string;
  readonly jobs: readonly JobPlan[];
  readonly users: number;
  /**
   * How long faults are injected, from the moment the first job runs. Injection goes on past it
   * while submissions are still going in, and stops early once every job has settled.
   */
  readonly faultWindowMs: number;
  readonly meanFaultGapMs: number;
  /** Weights over the default mix's after the first round (none: the default mix). */
  readonly faultWeights: FaultWeights;
  /** The faults of the window (the stream goes on after it; see `faultStream`). */
  readonly faults: readonly ScheduledFault[];
  /** Relative to the launch; they are meant to fall inside the fault window (see `WAVES_FROM_MS`). */
  readonly waves: readonly ErrorWave[];
  readonly concurrency: number;
  /** The whole run's bound: submissions, faults, settling. */
  readonly timeLimitMs: number;
}

export interface PlanOptions {
  readonly jobs: number;
  readonly seed: string;
  readonly concurrency?: number;
  readonly timeLimitSeconds?: number;
  readonly faultWindowSeconds?: number;
  /** Mean gap between two faults in seconds (waves and submit retries not included); default 2. */
  readonly meanFaultGapSeconds?: number;
  /** Weights for the faults after the first round, over the default mix's (a focused run: one kind weighted up). */
  readonly faultWeights?: FaultWeights;
}

/** Weights of injected kinds, each replacing that kind's default weight after the first round. */
export type FaultWeights = Readonly<Partial<Record<FaultSpec['kind'], number>>>;

/**
 * The functions see the waves on the clock from the launch (the moment the stack is started): the
 * build and the emulators take about this long, so the first wave is put after it.
 */
export const WAVES_FROM_MS = 45_000;

const QUESTIONS = [
  'How do idempotency keys keep retried payments from being charged twice?',
  'What do fencing tokens add to leases in a distributed job system?',
  'How should a long computation be checkpointed so that a crash loses little work?',
  'When do retries with backoff and jitter help, and when do they make an outage worse?',
  'How does a circuit breaker protect a system from a failing dependency?',
  'Why is exactly-once delivery a myth, and what do real systems promise instead?',
  'How does the transactional outbox pattern publish events reliably?',
  'How do heartbeats detect failed workers, and what are their false positives?',
  'What makes a poison message, and how should a queue quarantine it?',
  'How does write-ahead logging make a database crash-safe?',
];

const CANARY_TEXT = 'A canary job checks the path end to end.\n\nIt counts paragraphs and words, and publishes the count.';

/**
 * The engine settings for the soak: short leases so that reclaims happen within seconds, and a
 * stale-heartbeat threshold of 5 s (two and a half heartbeats; the engine's option check wants at
 * least two) so that a task redelivered after a killed worker (after 2 s of backoff, then 4 s
 * more, a new worker's cold start on top) can find its holder silent past it and take the step
 * over before the 8-second lease expires and the sweeper reclaims it. With the default 30 s the
 * lease always expired first and the take-over was hardly exercised (the default is now 10 s).
 */
export const CHAOS_ENGINE_ENV: Readonly<Record<string, string>> = {
  PHASELINE_LEASE_SECONDS: '8',
  PHASELINE_HEARTBEAT_SECONDS: '2',
  PHASELINE_STALE_HEARTBEAT_SECONDS: '5',
  // Every worker of the soak reads one machine's clock: a holder stops at 5 s, a redelivered task takes over at 6 s.
  PHASELINE_CLOCK_SKEW_SECONDS: '1',
  PHASELINE_PROGRESS_FLUSH_MS: '1000',
  PHASELINE_STEP_BUDGET_SECONDS: '60',
  PHASELINE_BACKOFF_BASE_SECONDS: '1',
  PHASELINE_BACKOFF_MAX_SECONDS: '8',
  PHASELINE_LOST_TASK_GRACE_SECONDS: '15',
};

/** The receiver as the notify pipeline sees it: answers within 2 s or the outcome is unknown; outages pause 4 s. */
export const CHAOS_RECEIVER_ENV: Readonly<Record<string, string>> = {
  PHASELINE_RECEIVER_TIMEOUT_MS: '2000',
  PHASELINE_RECEIVER_WAIT_SECONDS: '4',
};

/**
 * The job's index in its question makes its prompts, and so the offline model's tool call IDs, its
 * own: the tool-call check tells executions apart by call ID alone.
 */
const ownQuestion = (question: string, index: number): string => `${question} (soak job ${index})`;

export function planJobs(seed: string, count: number): JobPlan[] {
  const rng = new Rng(`${seed}/jobs`);
  // A stream of its own, so that the cancellations leave every other draw (and so older seeds' job mixes) as they were.
  const cancels = new Rng(`${seed}/cancels`);
  return Array.from({ length: count }, (_, index): JobPlan => {
    const cancel = cancels.chance(CANCEL_SHARE);
    const pipeline = rng.weighted<Pipeline>([
      ['research', 0.62],
      ['notify', 0.3],
      ['canary', 0.08],
    ]);
    const input: Record<string, unknown> =
      pipeline === 'research'
        ? { question: ownQuestion(rng.pick(QUESTIONS), index), experts: rng.int(1, 2), sections: rng.int(1, 2), wordsPerSection: rng.int(50, 70) }
        : pipeline === 'notify'
          ? { campaign: `Chaos ${seed} job ${index}`, recipients: rng.int(2, 5) }
          : { text: CANARY_TEXT };
    return { index, pipeline, input, idempotencyKey: `chaos-${seed}-${index}`, user: rng.int(0, 2), resubmit: rng.chance(0.08), cancelMidSend: pipeline === 'notify' && cancel };
  });
}

function receiverOutage(rng: Rng): FaultSpec {
  const mode = rng.weighted<ReceiverOutageMode>([
    ['unavailable', 2],
    ['refused', 1],
    ['apply-then-hang', 2],
    ['fail-before-apply', 1.5],
    ['drop-connection', 1.5],
    ['hang-and-lookups-fail', 1],
  ]);
  return { kind: 'receiver-outage', mode, durationMs: rng.int(2_000, 6_000), times: rng.int(1, 3) };
}

const INJECTED_KINDS: readonly (readonly [FaultSpec['kind'], number])[] = [
  ['worker-kill', 3],
  ['lease-expiry', 3],
  ['duplicate-delivery', 3],
  ['receiver-outage', 2],
  ['checkpoint-write-failure', 0.8],
  ['worker-freeze', 1.5],
  ['task-loss', 1.5],
  ['commit-answer-lost', 1.5],
  // A reload of every function and a freeze of a few seconds: rare.
  ['rolling-deploy', 0.3],
];

/**
 * How long a frozen worker stays stopped: past its lease (8 s) and the sweeper's next pass (2 s),
 * so that the woken process finds itself fenced out.
 */
const FREEZE_MS: readonly [number, number] = [12_000, 18_000];

function faultOf(kind: FaultSpec['kind'], rng: Rng): FaultSpec {
  switch (kind) {
    case 'receiver-outage':
      return receiverOutage(rng);
    case 'checkpoint-write-failure':
      return rng.chance(0.5) ? { kind, mode: 'stall', durationMs: rng.int(2_000, 8_000) } : { kind, mode: 'cut', durationMs: rng.int(1_000, 5_000) };
    case 'duplicate-delivery':
      return { kind, staleStep: rng.chance(0.3) };
    case 'worker-freeze':
      return { kind, durationMs: rng.int(...FREEZE_MS) };
    case 'rolling-deploy':
      return { kind, freeze: rng.int(1, 2), frozenMs: rng.int(...FREEZE_MS) };
    case 'worker-kill':
    case 'lease-expiry':
    case 'task-loss':
    case 'commit-answer-lost':
      return { kind };
  }
}

/** The first round's order ends with the faults that hold everything up: a reload of the functions, then Firestore's pause. */
const LAST_IN_FIRST_ROUND: readonly FaultSpec['kind'][] = ['rolling-deploy', 'checkpoint-write-failure'];

/** How many faults the first round holds: every injected kind once. */
export const FIRST_ROUND_LENGTH = INJECTED_KINDS.length;

/** Spacing of the first round: every kind once, soon, so that a short run exercises each of them. */
export const FIRST_ROUND_GAP_MS = 1_200;

/**
 * Faults without end: the run takes them while it injects (the fault window, and for as long as
 * submissions are still going in). The first round takes every kind once, 1.2 s apart, in a seeded
 * order with the rolling deploy and then Firestore's pause last (they hold up everything for
 * seconds); after that, a Poisson process with kinds drawn by weight.
 */
export function* faultStream(seed: string, meanGapMs: number, weights: FaultWeights = {}): Generator<ScheduledFault, never> {
  const mix = INJECTED_KINDS.map(([kind, weight]): readonly [FaultSpec['kind'], number] => [kind, weights[kind] ?? weight]);
  const rng = new Rng(`${seed}/faults`);
  const firstRound = INJECTED_KINDS.filter(([kind]) => !LAST_IN_FIRST_ROUND.includes(kind))
    .map(([kind]) => ({ kind, order: rng.next() }))
    .sort((a, b) => a.order - b.order)
    .map((item) => item.kind);
  firstRound.push(...LAST_IN_FIRST_ROUND);
  let atMs = 500;
  for (const kind of firstRound) {
    yield { atMs, spec: faultOf(kind, rng) };
    atMs += FIRST_ROUND_GAP_MS;
  }
  for (;;) {
    atMs += rng.exponential(meanGapMs);
    yield { atMs: Math.round(atMs), spec: faultOf(rng.weighted(mix), rng) };
  }
}

/** The faults of the stream that fall inside a window. */
export function planFaults(seed: string, windowMs: number, meanGapMs: number, weights: FaultWeights = {}): ScheduledFault[] {
  const faults: ScheduledFault[] = [];
  for (const fault of faultStream(seed, meanGapMs, weights)) {
    if (fault.atMs >= windowMs) break;
    faults.push(fault);
  }
  return faults;
}

/** Waves inside [WAVES_FROM_MS, WAVES_FROM_MS + windowMs): mostly short 429 bursts, some 503 outages. */
export function planWaves(seed: string, windowMs: number): ErrorWave[] {
  const rng = new Rng(`${seed}/waves`);
  const waves: ErrorWave[] = [];
  const end = WAVES_FROM_MS + windowMs;
  for (let startMs = WAVES_FROM_MS + rng.int(5_000, 20_000); startMs < end - 3_000; startMs += rng.int(30_000, 70_000)) {
    const status = rng.chance(0.6) ? 429 : 503;
    const lengthMs = rng.int(3_000, status === 429 ? 8_000 : 6_000);
    waves.push({ startMs, endMs: Math.min(startMs + lengthMs, end), status, ...(status === 429 ? { retryAfterMs: rng.int(500, 2_000) } : {}) });
  }
  return waves;
}

export function planRun(options: PlanOptions): RunPlan {
  if (!Number.isInteger(options.jobs) || options.jobs < 1) throw new Error(`--jobs must be a positive integer, got ${options.jobs}`);
  const faultWindowMs = (options.faultWindowSeconds ?? Math.min(900, Math.max(30, options.jobs * 2.5))) * 1000;
  const meanGapMs = (options.meanFaultGapSeconds ?? 2) * 1000;
  for (const [kind, weight] of Object.entries(options.faultWeights ?? {})) {
    if (!INJECTED_KINDS.some(([known]) => known === kind)) throw new Error(`--weight: no injected fault kind ${kind} (${INJECTED_KINDS.map(([known]) => known).join(', ')})`);
    if (!(typeof weight === 'number' && Number.isFinite(weight) && weight >= 0)) throw new Error(`--weight ${kind} must be a number at least 0, got ${String(weight)}`);
  }
  return {
    seed: options.seed,
    jobs: planJobs(options.seed, options.jobs),
    users: 3,
    faultWindowMs,
    meanFaultGapMs: meanGapMs,
    faultWeights: options.faultWeights ?? {},
    faults: planFaults(options.seed, faultWindowMs, meanGapMs, options.faultWeights),
    waves: planWaves(options.seed, faultWindowMs),
    concurrency: options.concurrency ?? Math.min(8, options.jobs),
    timeLimitMs: (options.timeLimitSeconds ?? 300 + options.jobs * 10) * 1000,
  };
}

/**
 * PHASELINE_OFFLINE_SETTINGS for the run: the waves, a little simulated trouble, simulated prices,
 * and where the toolbox logs its executions (when given).
 */
export function offlineSettings(plan: RunPlan, epochMs: number, instrumentation: { readonly toolExecutionLog?: string } = {}): Record<string, unknown> {
  return {
    ...(instrumentation.toolExecutionLog === undefined ? {} : { toolExecutionLog: instrumentation.toolExecutionLog }),
    // A little latency per model call, so that steps last long enough for faults to land inside them.
    latencyMs: 100,
    timeoutMs: 1_500,
    epochMs,
    errorWaves: plan.waves.map((wave) => ({ ...wave })),
    timeoutRate: 0.02,
    malformedRate: 0.03,
    partialToolResultsRate: 0.05,
    // Simulated prices (no money is spent) so that wasted cost has a figure.
    inputUsdPer1kTokens: 0.00015,
    outputUsdPer1kTokens: 0.0006,
  };
}
