/** What every step shares: its dependencies and outcome, the running state of one claim (abort signal, progress clock), the progress-gated heartbeat, task dispatch, and the bare context for code that runs inside engine commits. */
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import type { RandomSource } from '../../core/clock';
import { describeError, PhaselineError } from '../../core/errors';
import { DraftThrottle } from '../../core/draft-throttle';
import { CoalescingFlusher, realTimers, type FlushPayload, type Timers } from '../../core/flusher';
import { type Lease, type StepTask } from '../../core/job';
import { type Dispatch } from '../../core/transitions';
import { type PhaseDefinition, type PipelineDefinition, type PipelineRegistry, type StepContext, type StepLimits } from '../../core/pipeline';
import type { EngineOptions } from '../../core/options';
import type { JobClaim, UnitClaim } from '../../core/claims';
import type { JobStore } from '../../store/job-store';
import { addRejectedTask } from '../../store/job-documents';
import { writeDraft } from '../../store/drafts';
import { defaultSpendLedger, type SpendLedger } from '../../store/quota-documents';
import { StepSpendMeter } from '../spend-meter';
import type { TaskQueuePort } from '../../store/task-queue';
import { createStepContext, noDurableWrites, type ContextParts } from '../context';
import { annotateStep } from '../../telemetry/scope';

export interface RunnerDeps {
  readonly store: JobStore;
  readonly queue: TaskQueuePort;
  readonly pipelines: PipelineRegistry;
  readonly random: RandomSource;
  /** A name for people reading the lease; ownership is the epoch, never this. */
  readonly worker?: string;
  readonly timers?: Timers;
  readonly log?: (message: string, detail?: Record<string, unknown>) => void;
  /** Owners' daily spend caps; absent: the default caps, read and charged through the store's Firestore. */
  readonly spendLedger?: SpendLedger;
}

export type StepOutcome =
  | { readonly kind: 'rejected'; readonly reason: string }
  | { readonly kind: 'not-claimable'; readonly reason: string }
  | { readonly kind: 'not-yet-due'; readonly retryAfterMs: number }
  | { readonly kind: 'handed-off'; readonly phase: string; readonly checkpointed: boolean }
  | { readonly kind: 'fanned-out'; readonly phase: string; readonly units: number }
  | { readonly kind: 'unit-done'; readonly unit: string; readonly joined: boolean }
  | { readonly kind: 'unit-yielded'; readonly unit: string }
  | { readonly kind: 'completed'; readonly outcome: 'complete' | 'partial' }
  | { readonly kind: 'waiting'; readonly reason: string }
  | { readonly kind: 'requeued'; readonly attempts: number; readonly delayMs: number }
  | { readonly kind: 'failed'; readonly reason: string }
  | { readonly kind: 'ownership-lost'; readonly reason: string }
  /** No progress within the bound: the step gave its job or unit back (counted as a lost worker). */
  | { readonly kind: 'stalled'; readonly reason: string };

export const defaultWorkerName = (): string => `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;

export interface Running {
  readonly deps: RunnerDeps;
  readonly worker: string;
  readonly pipeline: PipelineDefinition<unknown>;
  readonly input: unknown;
  /** Answers people gave, as the job held them when this step claimed it. */
  readonly decisions: Readonly<Record<string, string>>;
  /** The claimed record's lost-worker count: the first section recorded resets it (durable-writes). */
  readonly staleReclaimsAtClaim: number;
  readonly controller: AbortController;
  /** When the step last showed progress; the heartbeat renews the lease only while this is recent. */
  progressAtMs: number;
  /** The job owner's daily spend cap, for every model call of this step. */
  readonly spend: StepSpendMeter;
}

/** The step showed no progress within `progressTimeoutSeconds`: it gives its job back instead of holding it. */
export class NoProgressError extends PhaselineError {
  constructor(message: string) {
    super('internal', true, message);
  }
}

export function newRunning(
  deps: RunnerDeps,
  worker: string,
  pipeline: PipelineDefinition<unknown>,
  input: unknown,
  claimed: { readonly owner: string; readonly decisions: Readonly<Record<string, string>>; readonly staleReclaims: number },
  /** Names the step's spend charges (stepChargeScope): unique to this claim, so a charge written again is recognised. */
  chargeScope: string,
): Running {
  const { store } = deps;
  const spend = new StepSpendMeter(deps.spendLedger ?? defaultSpendLedger(store), claimed.owner, store.clock, { chargeScope, ...(deps.log ? { log: deps.log } : {}) });
  return { deps, worker, pipeline, input, decisions: claimed.decisions, staleReclaimsAtClaim: claimed.staleReclaims, controller: new AbortController(), progressAtMs: store.clock.now(), spend };
}

/** Settles with the work, or rejects with the abort reason as soon as the claim is lost or the step stalls. */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason as Error);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason as Error);
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (error: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(error instanceof Error ? error : new Error(String(error)));
      },
    );
  });
}

export function stepLimits(options: EngineOptions): StepLimits {
  return { maxServerDelayMs: options.maxServerDelaySeconds * 1000 };
}

export function freshLease(running: Running, epoch: number): Lease {
  const nowMs = running.deps.store.clock.now();
  return { epoch, worker: running.worker, expiresAtMs: nowMs + running.deps.store.options.leaseSeconds * 1000, renewedAtMs: nowMs };
}

/**
 * The flusher's write, gated on progress: a step that showed none within `progressTimeoutSeconds`
 * does not renew its lease; it aborts itself (NoProgressError) and gives the job back.
 */
export function progressGated(running: Running, write: (payload: FlushPayload) => Promise<void>): (payload: FlushPayload) => Promise<void> {
  const { store } = running.deps;
  return (payload) => {
    const idleMs = store.clock.now() - running.progressAtMs;
    if (idleMs > store.options.progressTimeoutSeconds * 1000) {
      running.controller.abort(new NoProgressError(`no progress for ${Math.round(idleMs / 1000)} s (limit ${store.options.progressTimeoutSeconds} s): a call or tool never came back`));
      return Promise.resolve();
    }
    return write(payload);
  };
}

export function startFlusher(running: Running, write: (payload: FlushPayload) => Promise<void>): CoalescingFlusher {
  const { store } = running.deps;
  const flusher = new CoalescingFlusher(write, {
    minIntervalMs: store.options.progressFlushMs,
    heartbeatMs: store.options.heartbeatSeconds * 1000,
    clock: store.clock,
    ...(running.deps.timers ? { timers: running.deps.timers } : {}),
    onOwnershipLost: (error) => running.controller.abort(error),
    onWriteError: (error) => running.deps.log?.('progress write failed; kept for the next flush', { error: describeError(error) }),
  });
  flusher.start();
  return flusher;
}

/** Drafts are rewritten at most this often per section, however short the progress interval is set. */
const DRAFT_MIN_INTERVAL_MS = 1_000;

/** Drafts of this step's sections in flight, paced like progress (never faster than once a second); stop it when the step ends. */
export function startDrafts(running: Running, jobId: string, phase: string, unit: string | null, epoch: number): DraftThrottle {
  const { store } = running.deps;
  return new DraftThrottle((sectionId, text) => writeDraft(store, jobId, { phase, unit, id: sectionId, text, epoch }), {
    minIntervalMs: Math.max(DRAFT_MIN_INTERVAL_MS, store.options.progressFlushMs),
    clock: store.clock,
    timers: running.deps.timers ?? realTimers,
    onWriteError: (error) => running.deps.log?.('draft write failed; the next text replaces it', { error: describeError(error) }),
  });
}

export function lost(running: Running, reason: unknown): StepOutcome {
  running.deps.log?.('step stopped: ownership lost', { reason: describeError(reason) });
  return { kind: 'ownership-lost', reason: describeError(reason) };
}

/** Enqueues a committed transition's task, if it has one. */
export async function dispatchQuietly(deps: RunnerDeps, dispatch: Dispatch | undefined): Promise<void> {
  if (dispatch) await enqueueQuietly(deps, dispatch.task, dispatch.id, dispatch.delayMs);
}

export async function enqueueQuietly(deps: RunnerDeps, task: StepTask, id: string, delayMs: number): Promise<void> {
  try {
    await deps.queue.enqueue(task, { id, delaySeconds: delayMs / 1000 });
  } catch (error) {
    // The state change is durable; the sweeper re-dispatches a queued job whose task went missing.
    deps.log?.('enqueue failed; the sweeper will re-dispatch', { task, error: describeError(error) });
  }
}

/** What every context of one claim shares: the job, the claim's signal, clock, randomness and limits. */
function claimParts(running: Running, jobId: string) {
  const { store } = running.deps;
  return { jobId, input: running.input, decisions: running.decisions, signal: running.controller.signal, clock: store.clock, random: running.deps.random, limits: stepLimits(store.options) };
}

/**
 * The context a working phase or unit runs with: the step's time budget from now, and a progress
 * hook that keeps the lease alive (see progressGated).
 */
export function workingContext(
  running: Running,
  parts: Pick<ContextParts<unknown>, 'jobId' | 'unit' | 'phase' | 'states' | 'sections' | 'flusher' | 'durable' | 'drafts'>,
): StepContext<unknown> {
  const { store } = running.deps;
  const budgetMs = store.options.stepBudgetSeconds * 1000;
  // The phase this step works on, for its log lines and spans (telemetry): a new job's claimed record names none yet.
  annotateStep({ phase: parts.phase.name });
  return createStepContext({
    ...claimParts(running, parts.jobId),
    ...parts,
    deadlineMs: store.clock.now() + budgetMs,
    budgetMs,
    spend: running.spend,
    onProgress: () => {
      running.progressAtMs = store.clock.now();
    },
  });
}

/** A context for code that runs inside the engine's own commits (units listing, join, publish): no durable writes of its own. */
export function bareContext(running: Running, jobId: string, phase: PhaseDefinition<unknown, unknown>, states: ReadonlyMap<string, unknown>, who: string): StepContext<unknown> {
  return createStepContext({
    ...claimParts(running, jobId),
    unit: null,
    phase,
    states,
    sections: [],
    flusher: null,
    deadlineMs: Number.POSITIVE_INFINITY,
    budgetMs: 0,
    durable: noDurableWrites(who),
  });
}

export type SectionOwner = { readonly kind: 'job'; readonly claim: JobClaim } | { readonly kind: 'unit'; readonly claim: UnitClaim };

/** Records a task that could not be understood (for a person) and acknowledges it to Cloud Tasks. */
export async function recordRejectedTask(deps: RunnerDeps, payload: unknown, reason: string): Promise<void> {
  let text: string;
  try {
    text = payload === undefined ? 'undefined' : JSON.stringify(payload);
  } catch {
    text = String(payload);
  }
  deps.log?.('task rejected', { reason });
  await addRejectedTask(deps.store, { payload: text.slice(0, 10_000), reason, atMs: deps.store.clock.now() });
}
