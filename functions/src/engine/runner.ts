/**
 * One task = one bounded step. A step claims the job (or a fan-out unit) with a new fencing epoch,
 * works out from stored state where to resume, runs one phase (or unit) inside a time budget with
 * a heartbeat, and makes the result durable through owner-checked transactions before handing off
 * to the next task. Losing the claim aborts the step through its AbortSignal.
 */
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { z } from 'zod';
import type { RandomSource } from '../core/clock';
import { describeError, OwnershipLostError, PhaselineError, TerminalError, toPhaselineError } from '../core/errors';
import { documentId, documentIdProblem } from '../core/ids';
import { addCounts, applyClaimTally, CoalescingFlusher, EMPTY_FLUSH, type FlushPayload, type Timers } from '../core/flusher';
import { type JobRecord, type JobWait, type Lease, type StepTask } from '../core/job';
import { decideAfterError, waitRecord } from '../core/lifecycle';
import {
  claimJob,
  claimUnit,
  completeJob,
  giveBackJob,
  giveBackUnit,
  handOffJob,
  joinJob,
  settleJobError,
  requeueUnit,
  startFanOutJob,
  takeOverJob,
  takeOverUnit,
  TransitionRefused,
  unitDispatch,
  waitJob,
  yieldUnit,
  type Dispatch,
  type Transition,
} from '../core/transitions';
import { PHASE_NAME_PATTERN, resumePhaseIndex, type PhaseDefinition, type PipelineDefinition, type PipelineRegistry, type SectionRecord, type StepContext, type StepLimits } from '../core/pipeline';
import type { EngineOptions } from '../core/options';
import { firestoreEffectLedger, unresolvedEffectKeys } from '../effects/firestore-ledger';
import { decodeJob, decodeUnit, encodeUnit, type UnitRecord } from '../store/codec';
import type { EventDraft, JobClaim, JobStore, UnitClaim } from '../store/job-store';
import { messagePath, REJECTED_TASKS, resultPath, sectionKey, sectionPath, transcriptPath, unitsPath } from '../store/paths';
import type { TaskQueuePort } from '../store/task-queue';
import { checkpointDocumentFor, loadCheckpoints, loadSections } from './checkpoints';
import { createStepContext, noDurableWrites, type DurableWrites } from './context';

export interface RunnerDeps {
  readonly store: JobStore;
  readonly queue: TaskQueuePort;
  readonly pipelines: PipelineRegistry;
  readonly random: RandomSource;
  /** A name for people reading the lease; ownership is the epoch, never this. */
  readonly worker?: string;
  readonly timers?: Timers;
  readonly log?: (message: string, detail?: Record<string, unknown>) => void;
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

// The one check for IDs from outside (core/ids): the fan-out below lists units by the same rule, so its tasks are never refused.
const firestoreId = documentId('ID');
const phaseName = z.string().regex(PHASE_NAME_PATTERN, 'must be a kebab-case phase name');
const stepTaskSchema = z
  .strictObject({ jobId: firestoreId, step: z.number().int().nonnegative(), unit: firestoreId.optional(), phase: phaseName.optional() })
  .refine((task) => (task.unit === undefined) === (task.phase === undefined), 'a unit task names both its unit and its phase; a job task names neither');

export const defaultWorkerName = (): string => `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;

/** Entry point for one delivered task. Never throws for a task that should not be redelivered. */
export async function runStep(deps: RunnerDeps, payload: unknown): Promise<StepOutcome> {
  const parsed = stepTaskSchema.safeParse(payload);
  if (!parsed.success) {
    const reason = `Malformed task payload: ${z.prettifyError(parsed.error)}`;
    await recordRejectedTask(deps, payload, reason);
    return { kind: 'rejected', reason };
  }
  const { jobId, step, unit, phase } = parsed.data;
  const task: StepTask = unit === undefined || phase === undefined ? { jobId, step } : { jobId, step, unit, phase };
  try {
    return task.unit === undefined || task.phase === undefined ? await runJobStep(deps, task) : await runUnitStep(deps, task, task.unit, task.phase);
  } catch (error) {
    if (error instanceof OwnershipLostError) return { kind: 'ownership-lost', reason: error.message };
    throw error;
  }
}

async function recordRejectedTask(deps: RunnerDeps, payload: unknown, reason: string): Promise<void> {
  let text: string;
  try {
    text = payload === undefined ? 'undefined' : JSON.stringify(payload);
  } catch {
    text = String(payload);
  }
  deps.log?.('task rejected', { reason });
  await deps.store.db.collection(REJECTED_TASKS).add({ payload: text.slice(0, 10_000), reason, atMs: deps.store.clock.now() });
}

interface Running {
  readonly deps: RunnerDeps;
  readonly worker: string;
  readonly pipeline: PipelineDefinition<unknown>;
  readonly input: unknown;
  /** Answers people gave, as the job held them when this step claimed it. */
  readonly decisions: Readonly<Record<string, string>>;
  readonly controller: AbortController;
  /** When the step last showed progress; the heartbeat renews the lease only while this is recent. */
  progressAtMs: number;
}

/** The step showed no progress within `progressTimeoutSeconds`: it gives its job back instead of holding it. */
class NoProgressError extends PhaselineError {
  constructor(message: string) {
    super('internal', true, message);
  }
}

function newRunning(deps: RunnerDeps, worker: string, pipeline: PipelineDefinition<unknown>, input: unknown, decisions: Readonly<Record<string, string>>): Running {
  return { deps, worker, pipeline, input, decisions, controller: new AbortController(), progressAtMs: deps.store.clock.now() };
}

/** Settles with the work, or rejects with the abort reason as soon as the claim is lost or the step stalls. */
function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
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

type ClaimResult = { job: JobRecord } | { reason: string; notYetDueMs?: number };

async function runJobStep(deps: RunnerDeps, task: StepTask): Promise<StepOutcome> {
  const { store } = deps;
  const worker = deps.worker ?? defaultWorkerName();
  const nowMs = store.clock.now();
  let claimed: ClaimResult;
  try {
    claimed = await store.transact<ClaimResult>(task.jobId, () => null, ({ job }) => {
      const input = { step: task.step, worker, options: store.options };
      let claim: Transition<JobRecord>;
      try {
        // A queued job is claimed; this task's own step still held after a crash is taken over once its holder went silent.
        claim = job.status === 'running' && job.step === task.step ? takeOverJob(job, input, nowMs) : claimJob(job, input, nowMs);
      } catch (error) {
        if (!(error instanceof TransitionRefused)) throw error;
        return Promise.resolve({ value: error.notYetDueMs === undefined ? { reason: error.message } : { reason: error.message, notYetDueMs: error.notYetDueMs } });
      }
      const value: ClaimResult = claim.next.status === 'running' ? { job: claim.next } : { reason: `job ${claim.next.status}: ${claim.events[0]?.message ?? ''}` };
      return Promise.resolve({ next: claim.next, events: claim.events, value });
    });
  } catch (error) {
    if (error instanceof OwnershipLostError) {
      await recordRejectedTask(deps, task, `No such job: ${task.jobId}`);
      return { kind: 'rejected', reason: `No such job: ${task.jobId}` };
    }
    throw error;
  }
  if (!('job' in claimed)) {
    if (claimed.notYetDueMs !== undefined) return { kind: 'not-yet-due', retryAfterMs: claimed.notYetDueMs };
    return { kind: 'not-claimable', reason: claimed.reason };
  }
  const job = claimed.job;
  const claim: JobClaim = { jobId: job.id, epoch: job.epoch };

  const pipeline = deps.pipelines.get(job.pipeline);
  if (!pipeline) return settleError(deps, claim, new TerminalError(`Unknown pipeline ${job.pipeline}`), EMPTY_FLUSH);
  const input = pipeline.input.safeParse(job.input);
  if (!input.success) {
    return settleError(deps, claim, new TerminalError(`Stored input fails the ${pipeline.name} schema: ${z.prettifyError(input.error)}`), EMPTY_FLUSH);
  }
  const running = newRunning(deps, worker, pipeline, input.data, job.decisions);

  const loaded = await loadCheckpoints(store.db, job.id, pipeline);
  const refusedNotes: EventDraft[] = loaded.refused.map((refusal) => ({
    kind: 'checkpoint-refused',
    message: `Stored checkpoint of ${refusal.phase} failed validation and will be redone: ${refusal.reason}`,
  }));
  const index = resumePhaseIndex(pipeline, new Set(loaded.states.keys()));
  if (index >= pipeline.phases.length) return complete(running, claim, loaded.states, refusedNotes);

  const phase = pipeline.phases[index] as PhaseDefinition<unknown, unknown>;
  if (job.phase !== null && job.phase !== phase.name) {
    refusedNotes.push({ kind: 'resumed', message: `Resuming at ${phase.name} (the job pointed at ${job.phase}; stored state decides)` });
  }
  if (phase.fanOut) return startFanOut(running, claim, phase, loaded.states, refusedNotes);
  return runPhase(running, claim, phase, index, loaded.states, refusedNotes);
}

function stepLimits(options: EngineOptions): StepLimits {
  return { maxServerDelayMs: options.maxServerDelaySeconds * 1000 };
}

function freshLease(running: Running, epoch: number): Lease {
  const nowMs = running.deps.store.clock.now();
  return { epoch, worker: running.worker, expiresAtMs: nowMs + running.deps.store.options.leaseSeconds * 1000, renewedAtMs: nowMs };
}

/**
 * The flusher's write, gated on progress: a step that showed none within `progressTimeoutSeconds`
 * does not renew its lease; it aborts itself (NoProgressError) and gives the job back.
 */
function progressGated(running: Running, write: (payload: FlushPayload) => Promise<void>): (payload: FlushPayload) => Promise<void> {
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

function startFlusher(running: Running, write: (payload: FlushPayload) => Promise<void>): CoalescingFlusher {
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

async function runPhase(
  running: Running,
  claim: JobClaim,
  phase: PhaseDefinition<unknown, unknown>,
  index: number,
  states: ReadonlyMap<string, unknown>,
  notes: EventDraft[],
): Promise<StepOutcome> {
  const { store } = running.deps;
  const loaded = await loadSections(store.db, claim.jobId, phase, null);
  for (const refusal of loaded.refused) notes.push({ kind: 'section-refused', message: `Section ${refusal.id} of ${phase.name} failed validation and will be redone: ${refusal.reason}` });

  const flusher = startFlusher(running, progressGated(running, (payload) =>
    store.asOwner(claim, ({ job }) => {
      const applied = applyClaimTally(job, payload, claim.epoch);
      return Promise.resolve({ next: { ...applied.next, lease: freshLease(running, claim.epoch) }, events: applied.notes, value: undefined });
    }),
  ));
  const context = createStepContext({
    jobId: claim.jobId,
    input: running.input,
    decisions: running.decisions,
    unit: null,
    signal: running.controller.signal,
    clock: store.clock,
    random: running.deps.random,
    phase,
    states,
    sections: loaded.sections,
    flusher,
    deadlineMs: store.clock.now() + store.options.stepBudgetSeconds * 1000,
    budgetMs: store.options.stepBudgetSeconds * 1000,
    limits: stepLimits(store.options),
    onProgress: () => {
      running.progressAtMs = store.clock.now();
    },
    durable: durableWrites(running, { kind: 'job', claim }, phase.name, null),
  });

  let outcome: Awaited<ReturnType<NonNullable<typeof phase.run>>>;
  try {
    outcome = await untilAborted((phase.run as NonNullable<typeof phase.run>)(context), running.controller.signal);
  } catch (error) {
    const pending = await flusher.stop();
    if (running.controller.signal.reason instanceof NoProgressError) return giveBack(running, { kind: 'job', claim }, running.controller.signal.reason, pending);
    if (running.controller.signal.aborted || error instanceof OwnershipLostError) return lost(running, error);
    return settleError(running.deps, claim, toPhaselineError(error), pending, notes);
  }
  const pending = await flusher.stop();
  if (running.controller.signal.reason instanceof NoProgressError) return giveBack(running, { kind: 'job', claim }, running.controller.signal.reason, pending);
  if (running.controller.signal.aborted) return lost(running, running.controller.signal.reason);

  try {
    switch (outcome.kind) {
      case 'done': {
        const parsed = phase.state.safeParse(outcome.state);
        if (!parsed.success) {
          return await settleError(running.deps, claim, new TerminalError(`Phase ${phase.name} produced a checkpoint that fails its schema: ${z.prettifyError(parsed.error)}`), pending, notes);
        }
        const nextPhase = running.pipeline.phases[index + 1];
        await handOff(running, claim, pending, notes, [{ kind: 'checkpointed', message: `Finished ${phase.name}` }], {
          checkpoint: { phase, state: parsed.data },
          nextPhase: nextPhase?.name ?? phase.name,
        });
        return { kind: 'handed-off', phase: phase.name, checkpointed: true };
      }
      case 'yield': {
        await handOff(running, claim, pending, notes, [{ kind: 'yielded', message: `${phase.name}: ${context.sections().length} sections recorded; continuing in a new step` }], {
          nextPhase: phase.name,
        });
        return { kind: 'handed-off', phase: phase.name, checkpointed: false };
      }
      case 'wait': {
        let waiting: JobWait;
        try {
          waiting = waitRecord(outcome);
        } catch (error) {
          return await settleError(running.deps, claim, toPhaselineError(error), pending, notes);
        }
        const nowMs = store.clock.now();
        await store.asOwner(claim, ({ job }) => {
          const applied = applyClaimTally(job, pending, claim.epoch);
          const transition = waitJob(applied.next, waiting, nowMs);
          return Promise.resolve({ next: transition.next, events: [...notes, ...applied.notes, ...transition.events], value: undefined });
        });
        return { kind: 'waiting', reason: waiting.reason };
      }
    }
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    throw error;
  }
}

function lost(running: Running, reason: unknown): StepOutcome {
  running.deps.log?.('step stopped: ownership lost', { reason: describeError(reason) });
  return { kind: 'ownership-lost', reason: describeError(reason) };
}

type SectionOwner = { readonly kind: 'job'; readonly claim: JobClaim } | { readonly kind: 'unit'; readonly claim: UnitClaim };

/**
 * A stalled step gives its job (or unit) back at once, counted as a lost worker (the quarantine
 * rule applies), rather than holding it until the platform kills the function.
 */
async function giveBack(running: Running, owner: SectionOwner, stall: NoProgressError, pending: FlushPayload): Promise<StepOutcome> {
  const { store } = running.deps;
  const nowMs = store.clock.now();
  running.deps.log?.('step stalled; giving the job back', { reason: stall.message });
  try {
    if (owner.kind === 'job') {
      const { claim } = owner;
      const given = await store.asOwner(claim, ({ job }) => {
        const applied = applyClaimTally(job, pending, claim.epoch);
        const transition = giveBackJob(applied.next, { why: stall.message, options: store.options }, nowMs);
        return Promise.resolve({ next: transition.next, events: [...applied.notes, ...transition.events], value: transition.dispatch });
      });
      await dispatchQuietly(running.deps, given);
      return { kind: 'stalled', reason: stall.message };
    }
    const { claim } = owner;
    const given = await store.asUnitOwner(claim, ({ job, unit }) => {
      const applied = applyClaimTally(unit, pending, claim.epoch);
      const transition = giveBackUnit(applied.next, { why: stall.message, options: store.options }, nowMs);
      if (transition.quarantine !== undefined) {
        const charged = chargeUnit(job, transition.next);
        return Promise.resolve({
          next: { ...charged.job, status: 'quarantined' as const, lease: null, quarantine: { reason: transition.quarantine, atMs: nowMs }, finishedAtMs: nowMs },
          nextUnit: charged.unit,
          events: [...applied.notes, ...transition.events],
          value: undefined,
        });
      }
      return Promise.resolve({ nextUnit: transition.next, events: [...applied.notes, ...transition.events], value: transition.dispatch });
    });
    await dispatchQuietly(running.deps, given);
    return { kind: 'stalled', reason: stall.message };
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    throw error;
  }
}

const PROGRESS_RESETS_POISON: EventDraft = {
  kind: 'progress',
  message: 'A section was recorded after a lost worker: the job is making progress, so its lost-worker count starts again',
};

/** Section and transcript writes, each made only while the writer still holds its claim. */
function durableWrites(running: Running, owner: SectionOwner, phase: string, unit: string | null): DurableWrites {
  const { store } = running.deps;
  const transcriptRef = (sectionId: string) => store.db.doc(transcriptPath(owner.claim.jobId, sectionKey(phase, unit, sectionId)));
  const asOwner = async <T>(body: (context: { tx: FirebaseFirestore.Transaction }) => Promise<{ value: T }>): Promise<T> => {
    try {
      return owner.kind === 'job' ? await store.asOwner(owner.claim, body) : await store.asUnitOwner(owner.claim, body);
    } catch (error) {
      if (error instanceof OwnershipLostError) running.controller.abort(error);
      throw error;
    }
  };
  /**
   * First write wins: a section is never rewritten. A recorded section is progress, so the poison
   * count (workers lost without progress) of its owner starts again: see the README's quarantine rule.
   */
  const writeSection = async (section: SectionRecord): Promise<boolean> => {
    const ref = store.db.doc(sectionPath(owner.claim.jobId, sectionKey(section.phase, section.unit, section.id)));
    const create = async (tx: FirebaseFirestore.Transaction): Promise<boolean> => {
      const existing = await tx.get(ref);
      if (existing.exists) return false;
      tx.create(ref, { ...section, epoch: owner.claim.epoch });
      return true;
    };
    try {
      if (owner.kind === 'job') {
        return await store.asOwner(owner.claim, async ({ tx, job }) => {
          const created = await create(tx);
          if (!created || job.staleReclaims === 0) return { value: created };
          return { next: { ...job, staleReclaims: 0 }, events: [PROGRESS_RESETS_POISON], value: created };
        });
      }
      return await store.asUnitOwner(owner.claim, async ({ tx, unit: current }) => {
        const created = await create(tx);
        if (!created || current.staleReclaims === 0) return { value: created };
        return { nextUnit: { ...current, staleReclaims: 0 }, events: [PROGRESS_RESETS_POISON], value: created };
      });
    } catch (error) {
      if (error instanceof OwnershipLostError) running.controller.abort(error);
      throw error;
    }
  };
  return {
    writeSection,
    loadTranscript: async (sectionId) => {
      const snapshot = await transcriptRef(sectionId).get();
      return snapshot.exists ? (snapshot.get('transcript') as unknown) : null;
    },
    saveTranscript: (sectionId, transcript) =>
      asOwner(({ tx }) => {
        tx.set(transcriptRef(sectionId), { phase, unit, id: sectionId, transcript, epoch: owner.claim.epoch, savedAtMs: store.clock.now() });
        return Promise.resolve({ value: undefined });
      }),
    effects: firestoreEffectLedger({
      db: store.db,
      jobId: owner.claim.jobId,
      unit,
      epoch: owner.claim.epoch,
      clock: store.clock,
      signal: running.controller.signal,
      owned: asOwner,
    }),
  };
}

interface HandOff {
  readonly checkpoint?: { readonly phase: PhaseDefinition<unknown, unknown>; readonly state: unknown };
  readonly nextPhase: string;
}

/**
 * Ends this step: optional checkpoint, job back to queued for the next step, and that step's task.
 * `lead` events come before the flusher's notes, `trail` after them.
 */
async function handOff(running: Running, claim: JobClaim, pending: FlushPayload, lead: readonly EventDraft[], trail: readonly EventDraft[], handOffTo: HandOff): Promise<void> {
  const { store } = running.deps;
  const nowMs = store.clock.now();
  const handedOff = await store.asOwner(claim, ({ tx, job }) => {
    if (handOffTo.checkpoint) {
      tx.set(store.checkpointRef(job.id, handOffTo.checkpoint.phase.name), checkpointDocumentFor(handOffTo.checkpoint.phase, handOffTo.checkpoint.state, claim.epoch, nowMs));
    }
    const applied = applyClaimTally(job, pending, claim.epoch);
    const transition = handOffJob(applied.next, { checkpointed: handOffTo.checkpoint !== undefined, nextPhase: handOffTo.nextPhase }, nowMs);
    return Promise.resolve({ next: transition.next, events: [...lead, ...applied.notes, ...trail, ...transition.events], value: transition });
  });
  await dispatchQuietly(running.deps, handedOff.dispatch);
}

/** Enqueues a committed transition's task, if it has one. */
async function dispatchQuietly(deps: RunnerDeps, dispatch: Dispatch | undefined): Promise<void> {
  if (dispatch) await enqueueQuietly(deps, dispatch.task, dispatch.id, dispatch.delayMs);
}

async function enqueueQuietly(deps: RunnerDeps, task: StepTask, id: string, delayMs: number): Promise<void> {
  try {
    await deps.queue.enqueue(task, { id, delaySeconds: delayMs / 1000 });
  } catch (error) {
    // The state change is durable; the sweeper re-dispatches a queued job whose task went missing.
    deps.log?.('enqueue failed; the sweeper will re-dispatch', { task, error: describeError(error) });
  }
}

/** How a unit's error was settled: requeued (with its task to enqueue) or the whole job failed. */
type SettledUnitError =
  | { readonly kind: 'requeued'; readonly attempts: number; readonly delayMs: number; readonly dispatch: Dispatch | undefined }
  | { readonly kind: 'failed'; readonly reason: string };

/** Records a caught error: requeue with backoff inside the budget, wait out a capped outage, otherwise fail. */
async function settleError(deps: RunnerDeps, claim: JobClaim, error: PhaselineError, pending: FlushPayload, notes: readonly EventDraft[] = []): Promise<StepOutcome> {
  const { store } = deps;
  const nowMs = store.clock.now();
  try {
    const settled = await store.asOwner(claim, ({ job }) => {
      const decision = decideAfterError(job, error, store.options, nowMs, deps.random);
      const applied = applyClaimTally(job, pending, claim.epoch);
      const transition = settleJobError(applied.next, { decision, error: { code: error.code, message: error.message, retryable: error.retryable, atMs: nowMs } }, nowMs);
      return Promise.resolve({ next: transition.next, events: [...notes, ...applied.notes, ...transition.events], value: { transition, decision } });
    });
    const { transition, decision } = settled;
    await dispatchQuietly(deps, transition.dispatch);
    switch (decision.action) {
      case 'requeue':
        return { kind: 'requeued', attempts: decision.attempts, delayMs: decision.nextRunAtMs - nowMs };
      case 'wait':
        return { kind: 'waiting', reason: 'provider' };
      case 'fail':
        return { kind: 'failed', reason: decision.reason };
    }
  } catch (writeError) {
    if (writeError instanceof OwnershipLostError) return { kind: 'ownership-lost', reason: writeError.message };
    throw writeError;
  }
}

/** Completion found ledger entries whose outcome is unknown: a pipeline defect, reported as a terminal failure that names them. */
class UnresolvedEffectsError extends TerminalError {
  constructor(keys: readonly string[]) {
    super(`Cannot complete while effects are unresolved (applying or unknown): ${keys.join(', ')}; the pipeline must reconcile them before it finishes`);
  }
}

/** A context for code that runs inside the engine's own commits (units listing, join, publish): no durable writes of its own. */
function bareContext(running: Running, jobId: string, phase: PhaseDefinition<unknown, unknown>, states: ReadonlyMap<string, unknown>, who: string) {
  const { store } = running.deps;
  return createStepContext({
    jobId,
    input: running.input,
    decisions: running.decisions,
    unit: null,
    signal: running.controller.signal,
    clock: store.clock,
    random: running.deps.random,
    phase,
    states,
    sections: [],
    flusher: null,
    deadlineMs: Number.POSITIVE_INFINITY,
    budgetMs: 0,
    limits: stepLimits(store.options),
    durable: noDurableWrites(who),
  });
}

/** The last phase is checkpointed: publish the answer and complete, in one owner-checked transaction. */
async function complete(running: Running, claim: JobClaim, states: ReadonlyMap<string, unknown>, notes: readonly EventDraft[]): Promise<StepOutcome> {
  const { store } = running.deps;
  const lastPhase = running.pipeline.phases[running.pipeline.phases.length - 1] as PhaseDefinition<unknown, unknown>;
  const context = bareContext(running, claim.jobId, { ...lastPhase, needs: running.pipeline.phases }, states, 'publication');
  let result;
  try {
    result = running.pipeline.publish(context);
  } catch (error) {
    return settleError(running.deps, claim, toPhaselineError(error), EMPTY_FLUSH, notes);
  }
  const nowMs = store.clock.now();
  try {
    await store.asOwner(claim, async ({ tx, job }) => {
      // A job cannot complete while an effect's outcome is unknown: the pipeline must reconcile it first.
      const unresolved = await unresolvedEffectKeys(tx, store.db, job.id);
      if (unresolved.length > 0) throw new UnresolvedEffectsError(unresolved);
      const outbox = store.db.doc(job.conversationId ? messagePath(job.conversationId, job.id) : resultPath(job.id));
      // The outbox ID is the job's own: an answer already there (a job an operator released after it
      // had published) is kept as it is, never published a second time.
      const published = await tx.get(outbox);
      if (!published.exists) {
        tx.create(outbox, {
          jobId: job.id,
          owner: job.owner,
          role: 'assistant',
          pipeline: job.pipeline,
          outcome: result.outcome,
          title: result.title,
          markdown: result.markdown,
          missing: result.missing,
          createdAtMs: nowMs,
        });
      }
      const completed = completeJob(job, { outcome: result.outcome, missing: result.missing }, nowMs);
      return { next: completed.next, events: [...notes, ...completed.events], value: undefined };
    });
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    if (error instanceof UnresolvedEffectsError) return settleError(running.deps, claim, error, EMPTY_FLUSH, notes);
    throw error;
  }
  return { kind: 'completed', outcome: result.outcome };
}

// ---------------------------------------------------------------------------------------------
// Fan-out: the coordinating step writes one unit document per unit and hands the work to unit
// tasks; the job stays `running` without a lease while its units hold theirs. The unit that
// finishes last joins, in the same transaction that records it, so the join happens exactly once.
//
// The invariant this keeps (checked by tests and the chaos soak over every job): a job that is
// `running` without a lease is in a fan-out with at least one unit queued (with a due time the
// sweeper acts on) or leased. So a fan-out that needs no unit work (no units, or every unit reused)
// joins in the very commit that starts it: there is no moment at which it has no live unit.

/** Thrown inside a fan-out commit when the pipeline's `join` fails: a defect, so the job fails with it. */
class JoinFailedError extends TerminalError {}

/** Joins a fan-out; anything that fails in it (a unit result or a join that no longer validates) fails the job with that reason. */
function joinState(phase: PhaseDefinition<unknown, unknown>, results: () => ReadonlyMap<string, unknown>, context: StepContext<unknown>): unknown {
  const fanOut = phase.fanOut;
  if (!fanOut) throw new Error(`Phase ${phase.name} has no fan-out`);
  try {
    return phase.state.parse(fanOut.join(results(), context));
  } catch (error) {
    throw new JoinFailedError(`Phase ${phase.name} could not join its units: ${describeError(error)}`);
  }
}

/** The phase after `phase` (or itself when it is the last): where the job goes once it checkpoints. */
function phaseAfter(running: Running, phase: PhaseDefinition<unknown, unknown>): string {
  const index = running.pipeline.phases.findIndex((candidate) => candidate.name === phase.name);
  return running.pipeline.phases[index + 1]?.name ?? phase.name;
}

/** Adds the part of a unit's cost the job has not counted yet; each unit's cost is counted once. */
function chargeUnit(job: JobRecord, unit: UnitRecord): { job: JobRecord; unit: UnitRecord } {
  const uncounted: Record<string, number> = {};
  for (const [key, value] of Object.entries(unit.cost)) {
    const counted = unit.costInJob[key] ?? 0;
    if (value > counted) uncounted[key] = value - counted;
  }
  return { job: { ...job, cost: addCounts(job.cost, uncounted) }, unit: { ...unit, costInJob: { ...unit.cost } } };
}

async function startFanOut(
  running: Running,
  claim: JobClaim,
  phase: PhaseDefinition<unknown, unknown>,
  states: ReadonlyMap<string, unknown>,
  notes: readonly EventDraft[],
): Promise<StepOutcome> {
  const { store } = running.deps;
  const fanOut = phase.fanOut;
  if (!fanOut) throw new Error(`Phase ${phase.name} has no fan-out`);
  const context = bareContext(running, claim.jobId, phase, states, 'a fan-out coordinator');
  let unitIds: readonly string[];
  try {
    unitIds = [...new Set(fanOut.units(context))];
    const refusedUnit = unitIds.find((unit) => documentIdProblem(unit) !== null);
    if (refusedUnit !== undefined) throw new Error(`unit ID ${JSON.stringify(refusedUnit.slice(0, 140))} ${documentIdProblem(refusedUnit)}`);
  } catch (error) {
    return settleError(running.deps, claim, new TerminalError(`Phase ${phase.name} could not list its units: ${describeError(error)}`), EMPTY_FLUSH, notes);
  }
  const nowMs = store.clock.now();
  let started: { readonly toEnqueue: readonly UnitRecord[]; readonly dispatch: Dispatch | undefined };
  try {
    started = await store.asOwner(claim, async ({ tx, job }) => {
      // Unit documents are keyed by phase and unit ID: another fan-out phase never sees them.
      const refs = unitIds.map((unit) => store.unitRef(job.id, phase.name, unit));
      const snapshots = refs.length > 0 ? await tx.getAll(...refs) : [];
      const toEnqueue: UnitRecord[] = [];
      const reused = new Map<string, unknown>();
      const records = snapshots.map((snapshot, position) => {
        const unit = unitIds[position] as string;
        const existing = snapshot.exists ? decodeUnit(snapshot.ref.path, snapshot.data()) : null;
        // A unit finished under an earlier fan-out of this phase is reused as it is, if its result still validates.
        const result = existing?.status === 'done' ? fanOut.unitState.safeParse(existing.result) : null;
        const record: UnitRecord = {
          jobId: job.id,
          unit,
          phase: phase.name,
          fanoutEpoch: claim.epoch,
          status: result?.success ? 'done' : 'queued',
          epoch: existing?.epoch ?? 0,
          lease: null,
          step: (existing?.step ?? -1) + 1,
          dispatch: 0,
          attempts: 0,
          staleReclaims: existing?.staleReclaims ?? 0,
          nextRunAtMs: nowMs,
          progress: existing?.progress ?? {},
          // Spent before stays spent and counted: a re-run adds only what it spends itself.
          cost: existing?.cost ?? {},
          costInJob: existing?.costInJob ?? {},
          claimTally: null,
          result: result?.success ? result.data : null,
          lastError: null,
          updatedAtMs: nowMs,
        };
        if (result?.success) reused.set(unit, result.data);
        else toEnqueue.push(record);
        return { ref: snapshot.ref, record };
      });
      const fanout = { phase: phase.name, epoch: claim.epoch, units: unitIds.length, done: reused.size };
      let joinedNextPhase: string | null = null;
      if (toEnqueue.length === 0) {
        const loaded = await loadCheckpoints(store.db, job.id, running.pipeline);
        const state = joinState(phase, () => reused, bareContext(running, job.id, phase, loaded.states, 'a join'));
        tx.set(store.checkpointRef(job.id, phase.name), checkpointDocumentFor(phase, state, claim.epoch, nowMs));
        joinedNextPhase = phaseAfter(running, phase);
      }
      const transition = startFanOutJob(job, { fanout, joinedNextPhase }, nowMs);
      for (const { ref, record } of records) tx.set(ref, encodeUnit({ ...record, updatedAtMs: store.clock.now() }));
      return { next: transition.next, events: [...notes, ...transition.events], value: { toEnqueue, dispatch: transition.dispatch } };
    });
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    if (error instanceof JoinFailedError) return settleError(running.deps, claim, error, EMPTY_FLUSH, notes);
    throw error;
  }
  await dispatchQuietly(running.deps, started.dispatch);
  for (const unit of started.toEnqueue) await dispatchQuietly(running.deps, unitDispatch(unit));
  return { kind: 'fanned-out', phase: phase.name, units: unitIds.length };
}


async function runUnitStep(deps: RunnerDeps, task: StepTask, unitId: string, phaseName: string): Promise<StepOutcome> {
  const { store } = deps;
  const worker = deps.worker ?? defaultWorkerName();
  const nowMs = store.clock.now();
  const jobRef = store.jobRef(task.jobId);
  const unitRef = store.unitRef(task.jobId, phaseName, unitId);
  type UnitClaimResult = { job: JobRecord; unit: UnitRecord } | { reason: string; notYetDueMs?: number };
  const claimed = await store.retryingWrite(`unit claim ${task.jobId}/${phaseName}/${unitId}`, () =>
    store.db.runTransaction(async (tx): Promise<UnitClaimResult> => {
      const [jobSnapshot, unitSnapshot] = await tx.getAll(jobRef, unitRef);
      if (!jobSnapshot?.exists || !unitSnapshot?.exists) return { reason: 'no such job or unit' };
      const job = decodeJob(task.jobId, jobSnapshot.data());
      const unit = decodeUnit(unitRef.path, unitSnapshot.data());
      const input = { step: task.step, worker, options: store.options };
      let claim: Transition<UnitRecord> & { readonly quarantine?: string };
      try {
        // A queued unit is claimed; this task's own unit step still held after a crash is taken over once its holder went silent.
        claim = unit.status === 'running' && unit.step === task.step ? takeOverUnit(job, unit, input, nowMs) : claimUnit(job, unit, input, nowMs);
      } catch (error) {
        if (!(error instanceof TransitionRefused)) throw error;
        return error.notYetDueMs === undefined ? { reason: error.message } : { reason: error.message, notYetDueMs: error.notYetDueMs };
      }
      store.commitUnit(tx, unitSnapshot, claim.next);
      if (claim.quarantine !== undefined) {
        store.commitJob(tx, jobSnapshot, job, { ...job, status: 'quarantined', lease: null, quarantine: { reason: claim.quarantine, atMs: nowMs }, finishedAtMs: nowMs }, claim.events);
        return { reason: `job quarantined: ${claim.quarantine}` };
      }
      // A takeover is told on the job's timeline; a plain claim stays off the hot job document.
      if (claim.events.length > 0) store.commitJob(tx, jobSnapshot, job, job, claim.events);
      return { job, unit: claim.next };
    }),
  );
  if (!('unit' in claimed)) {
    if (claimed.notYetDueMs !== undefined) return { kind: 'not-yet-due', retryAfterMs: claimed.notYetDueMs };
    return { kind: 'not-claimable', reason: claimed.reason };
  }
  const { job, unit } = claimed;
  const claim: UnitClaim = { jobId: job.id, phase: unit.phase, unit: unit.unit, epoch: unit.epoch, fanoutEpoch: unit.fanoutEpoch };
  const pipeline = deps.pipelines.get(job.pipeline);
  const phase = pipeline?.phases.find((candidate) => candidate.name === unit.phase);
  const input = pipeline?.input.safeParse(job.input);
  const running: Running | null = pipeline && input?.success ? newRunning(deps, worker, pipeline, input.data, job.decisions) : null;
  if (!running || !phase?.fanOut) {
    return failJobFromUnit(deps, claim, new TerminalError(`Unit ${unit.unit}: pipeline ${job.pipeline} has no fan-out phase ${unit.phase}, or the stored input no longer validates`));
  }
  const fanOut = phase.fanOut;
  const loaded = await loadCheckpoints(store.db, job.id, running.pipeline);
  const sections = await loadSections(store.db, job.id, phase, unit.unit);
  const flusher = startFlusher(running, progressGated(running, (payload) =>
    store.asUnitOwner(claim, ({ unit: current }) => {
      const applied = applyClaimTally(current, payload, claim.epoch);
      return Promise.resolve({ nextUnit: { ...applied.next, lease: freshLease(running, claim.epoch) }, events: applied.notes, value: undefined });
    }),
  ));
  const context = createStepContext({
    jobId: job.id,
    input: running.input,
    decisions: job.decisions,
    unit: unit.unit,
    signal: running.controller.signal,
    clock: store.clock,
    random: deps.random,
    phase,
    states: loaded.states,
    sections: sections.sections,
    flusher,
    deadlineMs: store.clock.now() + store.options.stepBudgetSeconds * 1000,
    budgetMs: store.options.stepBudgetSeconds * 1000,
    limits: stepLimits(store.options),
    onProgress: () => {
      running.progressAtMs = store.clock.now();
    },
    durable: durableWrites(running, { kind: 'unit', claim }, phase.name, unit.unit),
  });

  let outcome: Awaited<ReturnType<typeof fanOut.runUnit>>;
  try {
    outcome = await untilAborted(fanOut.runUnit(context, unit.unit), running.controller.signal);
  } catch (error) {
    const pending = await flusher.stop();
    if (running.controller.signal.reason instanceof NoProgressError) return giveBack(running, { kind: 'unit', claim }, running.controller.signal.reason, pending);
    if (running.controller.signal.aborted || error instanceof OwnershipLostError) return lost(running, error);
    return settleUnitError(deps, claim, toPhaselineError(error), pending);
  }
  const pending = await flusher.stop();
  if (running.controller.signal.reason instanceof NoProgressError) return giveBack(running, { kind: 'unit', claim }, running.controller.signal.reason, pending);
  if (running.controller.signal.aborted) return lost(running, running.controller.signal.reason);

  try {
    if (outcome.kind === 'yield') {
      const yielded = await store.asUnitOwner(claim, ({ unit: current }) => {
        const applied = applyClaimTally(current, pending, claim.epoch);
        const transition = yieldUnit(applied.next, store.clock.now());
        return Promise.resolve({ nextUnit: transition.next, events: [...applied.notes, ...transition.events], value: transition.dispatch });
      });
      await dispatchQuietly(deps, yielded);
      return { kind: 'unit-yielded', unit: unit.unit };
    }
    if (outcome.kind === 'wait') {
      let waiting: JobWait;
      try {
        waiting = waitRecord({ kind: 'wait', reason: 'provider', questionId: 'provider', question: outcome.question, untilMs: outcome.untilMs });
      } catch (error) {
        return await settleUnitError(deps, claim, toPhaselineError(error), pending);
      }
      await store.asUnitOwner(claim, ({ job: current, unit: currentUnit }) => {
        const applied = applyClaimTally(currentUnit, pending, claim.epoch);
        const charged = chargeUnit(current, applied.next);
        return Promise.resolve({
          // The fan-out ends here; on resume it starts again, reusing finished units and recorded sections.
          next: { ...charged.job, status: 'waiting' as const, fanout: null, lease: null, step: current.step + 1, dispatch: 0, waiting, nextRunAtMs: waiting.untilMs ?? store.clock.now() },
          nextUnit: { ...charged.unit, status: 'queued' as const, lease: null },
          events: [...applied.notes, { kind: 'waiting', message: `${unit.unit}: ${outcome.question}` }],
          value: undefined,
        });
      });
      return { kind: 'waiting', reason: outcome.reason };
    }
    const parsed = fanOut.unitState.safeParse(outcome.state);
    if (!parsed.success) {
      return await failJobFromUnit(deps, claim, new TerminalError(`Unit ${unit.unit} produced a result that fails its schema: ${z.prettifyError(parsed.error)}`));
    }
    const joined = await finishUnit(running, claim, phase, pending, parsed.data);
    return { kind: 'unit-done', unit: unit.unit, joined };
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    if (error instanceof JoinFailedError) return failJobFromUnit(deps, claim, error);
    throw error;
  }
}

/**
 * Records a finished unit and, if it was the last one, joins: the phase checkpoint from every
 * unit's result and the job's hand-off to its next step, all in the transaction that records it.
 */
async function finishUnit(running: Running, claim: UnitClaim, phase: PhaseDefinition<unknown, unknown>, pending: FlushPayload, result: unknown): Promise<boolean> {
  const { store } = running.deps;
  const fanOut = phase.fanOut;
  if (!fanOut) throw new Error(`Phase ${phase.name} has no fan-out`);
  const nowMs = store.clock.now();
  const settled = await store.asUnitOwner(claim, async ({ tx, job, unit }) => {
    const fanout = job.fanout;
    if (fanout?.epoch !== claim.fanoutEpoch) throw new OwnershipLostError(`Job ${claim.jobId} is no longer in fan-out epoch ${claim.fanoutEpoch}`);
    const applied = applyClaimTally(unit, pending, claim.epoch);
    const charged = chargeUnit(job, applied.next);
    const done = fanout.done + 1;
    const next: JobRecord = { ...charged.job, fanout: { ...fanout, done } };
    const events: EventDraft[] = [{ kind: 'unit-done', message: `${claim.unit} finished` }, ...applied.notes];
    if (done >= fanout.units) {
      const siblings = await store.db.collection(unitsPath(claim.jobId)).where('fanoutEpoch', '==', claim.fanoutEpoch).get();
      const loaded = await loadCheckpoints(store.db, claim.jobId, running.pipeline);
      const state = joinState(phase, () => {
        const results = new Map<string, unknown>();
        for (const doc of siblings.docs) {
          const sibling = decodeUnit(doc.ref.path, doc.data());
          if (sibling.phase !== phase.name) continue;
          results.set(sibling.unit, fanOut.unitState.parse(sibling.unit === claim.unit ? result : sibling.result));
        }
        return results;
      }, bareContext(running, claim.jobId, phase, loaded.states, 'a join'));
      tx.set(store.checkpointRef(claim.jobId, phase.name), checkpointDocumentFor(phase, state, claim.fanoutEpoch, nowMs));
      const joined = joinJob(next, { nextPhase: phaseAfter(running, phase), message: `${phase.name}: all ${fanout.units} units finished` }, nowMs);
      return { next: joined.next, nextUnit: { ...charged.unit, status: 'done' as const, lease: null, result }, events: [...events, ...joined.events], value: joined.dispatch };
    }
    return { next, nextUnit: { ...charged.unit, status: 'done' as const, lease: null, result }, events, value: undefined };
  });
  await dispatchQuietly(running.deps, settled);
  return settled !== undefined;
}

async function settleUnitError(deps: RunnerDeps, claim: UnitClaim, error: PhaselineError, pending: FlushPayload): Promise<StepOutcome> {
  const { store } = deps;
  const nowMs = store.clock.now();
  const settled = await store.asUnitOwner<SettledUnitError>(claim, ({ job, unit }) => {
    const decision = decideAfterError(unit, error, store.options, nowMs, deps.random);
    const lastError = { code: error.code, message: error.message, atMs: nowMs };
    const applied = applyClaimTally(unit, pending, claim.epoch);
    if (decision.action !== 'fail') {
      // A capped server delay holds only this unit back; its siblings go on, so it waits as a queued unit.
      const untilMs = decision.action === 'requeue' ? decision.nextRunAtMs : decision.untilMs;
      const message =
        decision.action === 'requeue'
          ? `${unit.unit}: attempt ${decision.attempts} failed (${error.code}: ${error.message})`
          : `${unit.unit}: ${error.message}: ${decision.reason}`;
      const transition = requeueUnit(applied.next, { attempts: decision.attempts, untilMs, message, kind: decision.action === 'requeue' ? 'retrying' : 'waiting', lastError }, nowMs);
      return Promise.resolve({
        nextUnit: transition.next,
        events: [...applied.notes, ...transition.events],
        value: { kind: 'requeued' as const, dispatch: transition.dispatch, delayMs: untilMs - nowMs, attempts: decision.attempts },
      });
    }
    const reason = `unit ${unit.unit}: ${decision.reason}`;
    const charged = chargeUnit(job, applied.next);
    const next: JobRecord = {
      ...charged.job,
      status: 'failed',
      fanout: null,
      lease: null,
      finishedAtMs: nowMs,
      lastError: { code: error.code, message: `${unit.unit}: ${error.message}`, retryable: error.retryable, atMs: nowMs },
    };
    const nextUnit: UnitRecord = { ...charged.unit, status: 'queued', lease: null, lastError };
    return Promise.resolve({ next, nextUnit, events: [...applied.notes, { kind: 'failed', message: `Failed: ${reason}. Last error: ${error.message}` }], value: { kind: 'failed' as const, reason } });
  });
  if (settled.kind === 'requeued') {
    await dispatchQuietly(deps, settled.dispatch);
    return { kind: 'requeued', attempts: settled.attempts, delayMs: settled.delayMs };
  }
  return settled;
}

function failJobFromUnit(deps: RunnerDeps, claim: UnitClaim, error: TerminalError): Promise<StepOutcome> {
  return settleUnitError(deps, claim, error, EMPTY_FLUSH);
}
