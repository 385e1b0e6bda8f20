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
import { addCounts, CoalescingFlusher, type FlushPayload, type Timers } from '../core/flusher';
import { stepTaskId, unitTaskId, type JobRecord, type StepTask } from '../core/job';
import { decideAfterError, decideClaim, waitRecord } from '../core/lifecycle';
import { resumePhaseIndex, type PhaseDefinition, type PipelineDefinition, type PipelineRegistry, type StepLimits } from '../core/pipeline';
import type { EngineOptions } from '../core/options';
import { firestoreEffectLedger, unresolvedEffectKeys } from '../effects/firestore-ledger';
import { decodeJob, decodeUnit, encodeUnit, type UnitRecord } from '../store/codec';
import type { EventDraft, JobClaim, JobStore, UnitClaim } from '../store/job-store';
import { messagePath, REJECTED_TASKS, resultPath, sectionKey, sectionPath, transcriptPath } from '../store/paths';
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
  | { readonly kind: 'ownership-lost'; readonly reason: string };

// The one check for IDs from outside (core/ids): the fan-out below lists units by the same rule, so its tasks are never refused.
const firestoreId = documentId('ID');
const stepTaskSchema = z.strictObject({ jobId: firestoreId, step: z.number().int().nonnegative(), unit: firestoreId.optional() });

export const defaultWorkerName = (): string => `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;

/** Entry point for one delivered task. Never throws for a task that should not be redelivered. */
export async function runStep(deps: RunnerDeps, payload: unknown): Promise<StepOutcome> {
  const parsed = stepTaskSchema.safeParse(payload);
  if (!parsed.success) {
    const reason = `Malformed task payload: ${z.prettifyError(parsed.error)}`;
    await recordRejectedTask(deps, payload, reason);
    return { kind: 'rejected', reason };
  }
  const task: StepTask = parsed.data.unit === undefined ? { jobId: parsed.data.jobId, step: parsed.data.step } : { ...parsed.data, unit: parsed.data.unit };
  try {
    return task.unit === undefined ? await runJobStep(deps, task) : await runUnitStep(deps, task, task.unit);
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
}

async function runJobStep(deps: RunnerDeps, task: StepTask): Promise<StepOutcome> {
  const { store } = deps;
  const worker = deps.worker ?? defaultWorkerName();
  const nowMs = store.clock.now();
  let claimed: { job: JobRecord } | { reason: string; notYetDueMs?: number };
  try {
    claimed = await store.transact<{ job: JobRecord } | { reason: string; notYetDueMs?: number }>(task.jobId, () => null, ({ job }) => {
      const decision = decideClaim(job, task.step, nowMs);
      if (!decision.claimable) return Promise.resolve({ value: decision });
      const epoch = job.epoch + 1;
      const next: JobRecord = { ...job, status: 'running', epoch, lease: { epoch, worker, expiresAtMs: nowMs + store.options.leaseSeconds * 1000 } };
      return Promise.resolve({ next, events: [{ kind: 'claimed', message: `Claimed by ${worker} (epoch ${epoch})` }], value: { job: next } });
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
  if (!pipeline) return settleError(deps, claim, new TerminalError(`Unknown pipeline ${job.pipeline}`), emptyPayload());
  const input = pipeline.input.safeParse(job.input);
  if (!input.success) {
    return settleError(deps, claim, new TerminalError(`Stored input fails the ${pipeline.name} schema: ${z.prettifyError(input.error)}`), emptyPayload());
  }
  const running: Running = { deps, worker, pipeline, input: input.data, decisions: job.decisions, controller: new AbortController() };

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

function emptyPayload(): FlushPayload {
  return { progress: {}, cost: {}, notes: [] };
}

function withPayload<T extends { progress: Readonly<Record<string, number>>; cost: Readonly<Record<string, number>> }>(record: T, payload: FlushPayload): T {
  return { ...record, progress: { ...record.progress, ...payload.progress }, cost: addCounts(record.cost, payload.cost) };
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

  const flusher = startFlusher(running, (payload) =>
    store.asOwner(claim, ({ job }) =>
      Promise.resolve({
        next: { ...withPayload(job, payload), lease: { epoch: claim.epoch, worker: running.worker, expiresAtMs: store.clock.now() + store.options.leaseSeconds * 1000 } },
        events: payload.notes,
        value: undefined,
      }),
    ),
  );
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
    durable: durableWrites(running, { kind: 'job', claim }, phase.name, null),
  });

  let outcome: Awaited<ReturnType<NonNullable<typeof phase.run>>>;
  try {
    outcome = await (phase.run as NonNullable<typeof phase.run>)(context);
  } catch (error) {
    const pending = await flusher.stop();
    if (running.controller.signal.aborted || error instanceof OwnershipLostError) return lost(running, error);
    return settleError(running.deps, claim, toPhaselineError(error), pending, notes);
  }
  const pending = await flusher.stop();
  if (running.controller.signal.aborted) return lost(running, running.controller.signal.reason);
  const allNotes = [...notes, ...pending.notes];

  try {
    switch (outcome.kind) {
      case 'done': {
        const parsed = phase.state.safeParse(outcome.state);
        if (!parsed.success) {
          return await settleError(running.deps, claim, new TerminalError(`Phase ${phase.name} produced a checkpoint that fails its schema: ${z.prettifyError(parsed.error)}`), pending, notes);
        }
        const nextPhase = running.pipeline.phases[index + 1];
        await handOff(running, claim, pending, [...allNotes, { kind: 'checkpointed', message: `Finished ${phase.name}` }], {
          checkpoint: { phase, state: parsed.data },
          nextPhase: nextPhase?.name ?? phase.name,
        });
        return { kind: 'handed-off', phase: phase.name, checkpointed: true };
      }
      case 'yield': {
        await handOff(running, claim, pending, [...allNotes, { kind: 'yielded', message: `${phase.name}: ${context.sections().length} sections recorded; continuing in a new step` }], {
          nextPhase: phase.name,
        });
        return { kind: 'handed-off', phase: phase.name, checkpointed: false };
      }
      case 'wait': {
        const nowMs = store.clock.now();
        await store.asOwner(claim, ({ job }) =>
          Promise.resolve({
            next: {
              ...withPayload(job, pending),
              status: 'waiting' as const,
              lease: null,
              step: job.step + 1,
              dispatch: 0,
              waiting: waitRecord(outcome),
              nextRunAtMs: outcome.reason === 'provider' ? outcome.untilMs : nowMs,
            },
            events: [...allNotes, { kind: 'waiting', message: outcome.question }],
            value: undefined,
          }),
        );
        return { kind: 'waiting', reason: outcome.reason };
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

/** Section and transcript writes, each made only while the writer still holds its claim. */
function durableWrites(running: Running, owner: SectionOwner, phase: string, unit: string | null): DurableWrites {
  const { store } = running.deps;
  const asOwner = async <T>(body: (context: { tx: FirebaseFirestore.Transaction }) => Promise<{ value: T }>): Promise<T> => {
    try {
      return owner.kind === 'job' ? await store.asOwner(owner.claim, body) : await store.asUnitOwner(owner.claim, body);
    } catch (error) {
      if (error instanceof OwnershipLostError) running.controller.abort(error);
      throw error;
    }
  };
  const transcriptRef = (sectionId: string) => store.db.doc(transcriptPath(owner.claim.jobId, sectionKey(phase, unit, sectionId)));
  return {
    // First write wins: a section is never rewritten.
    writeSection: (section) => {
      const ref = store.db.doc(sectionPath(owner.claim.jobId, sectionKey(section.phase, section.unit, section.id)));
      return asOwner(async ({ tx }) => {
        const existing = await tx.get(ref);
        if (existing.exists) return { value: false };
        tx.create(ref, { ...section, epoch: owner.claim.epoch });
        return { value: true };
      });
    },
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

/** Ends this step: optional checkpoint, job back to queued for the next step, and that step's task. */
async function handOff(running: Running, claim: JobClaim, pending: FlushPayload, events: readonly EventDraft[], handOffTo: HandOff): Promise<void> {
  const { store } = running.deps;
  const nowMs = store.clock.now();
  const next = await store.asOwner(claim, ({ tx, job }) => {
    if (handOffTo.checkpoint) {
      tx.set(store.checkpointRef(job.id, handOffTo.checkpoint.phase.name), checkpointDocumentFor(handOffTo.checkpoint.phase, handOffTo.checkpoint.state, claim.epoch, nowMs));
    }
    const record: JobRecord = {
      ...withPayload(job, pending),
      status: 'queued',
      lease: null,
      phase: handOffTo.nextPhase,
      step: job.step + 1,
      dispatch: 0,
      // A finished phase is progress: the error budget starts again for the next one.
      attempts: handOffTo.checkpoint ? 0 : job.attempts,
      nextRunAtMs: nowMs,
    };
    return Promise.resolve({ next: record, events, value: record });
  });
  await enqueueQuietly(running.deps, { jobId: next.id, step: next.step }, stepTaskId(next.id, next.step, next.dispatch), 0);
}

async function enqueueQuietly(deps: RunnerDeps, task: StepTask, id: string, delayMs: number): Promise<void> {
  try {
    await deps.queue.enqueue(task, { id, delaySeconds: delayMs / 1000 });
  } catch (error) {
    // The state change is durable; the sweeper re-dispatches a queued job whose task went missing.
    deps.log?.('enqueue failed; the sweeper will re-dispatch', { task, error: describeError(error) });
  }
}

type SettledError<TRecord> =
  | { readonly kind: 'requeued'; readonly attempts: number; readonly delayMs: number; readonly record: TRecord }
  | { readonly kind: 'failed'; readonly reason: string };

/** Records a caught error: requeue with backoff inside the budget, otherwise fail. */
async function settleError(deps: RunnerDeps, claim: JobClaim, error: PhaselineError, pending: FlushPayload, notes: readonly EventDraft[] = []): Promise<StepOutcome> {
  const { store } = deps;
  const nowMs = store.clock.now();
  try {
    const settled = await store.asOwner<SettledError<JobRecord>>(claim, ({ job }) => {
      const decision = decideAfterError(job, error, store.options, nowMs, deps.random);
      const base: JobRecord = {
        ...withPayload(job, pending),
        lease: null,
        attempts: decision.attempts,
        lastError: { code: error.code, message: error.message, retryable: error.retryable, atMs: nowMs },
      };
      if (decision.action === 'requeue') {
        const delayMs = decision.nextRunAtMs - nowMs;
        const next: JobRecord = { ...base, status: 'queued', step: job.step + 1, dispatch: 0, nextRunAtMs: decision.nextRunAtMs };
        return Promise.resolve({
          next,
          events: [...notes, ...pending.notes, { kind: 'retrying', message: `Attempt ${decision.attempts} failed (${error.code}: ${error.message}); retrying in ${Math.round(delayMs / 1000)} s` }],
          value: { kind: 'requeued' as const, attempts: decision.attempts, delayMs, record: next },
        });
      }
      const next: JobRecord = { ...base, status: 'failed', finishedAtMs: nowMs };
      return Promise.resolve({
        next,
        events: [...notes, ...pending.notes, { kind: 'failed', message: `Failed: ${decision.reason}. Last error (${error.code}): ${error.message}` }],
        value: { kind: 'failed' as const, reason: decision.reason },
      });
    });
    if (settled.kind === 'requeued') {
      await enqueueQuietly(deps, { jobId: claim.jobId, step: settled.record.step }, stepTaskId(claim.jobId, settled.record.step, 0), settled.delayMs);
      return { kind: 'requeued', attempts: settled.attempts, delayMs: settled.delayMs };
    }
    return settled;
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

/** The last phase is checkpointed: publish the answer and complete, in one owner-checked transaction. */
async function complete(running: Running, claim: JobClaim, states: ReadonlyMap<string, unknown>, notes: readonly EventDraft[]): Promise<StepOutcome> {
  const { store } = running.deps;
  const lastPhase = running.pipeline.phases[running.pipeline.phases.length - 1] as PhaseDefinition<unknown, unknown>;
  const context = createStepContext({
    jobId: claim.jobId,
    input: running.input,
    decisions: running.decisions,
    unit: null,
    signal: running.controller.signal,
    clock: store.clock,
    random: running.deps.random,
    phase: { ...lastPhase, needs: running.pipeline.phases },
    states,
    sections: [],
    flusher: null,
    deadlineMs: Number.POSITIVE_INFINITY,
    budgetMs: 0,
    limits: stepLimits(store.options),
    durable: noDurableWrites('publication'),
  });
  let result;
  try {
    result = running.pipeline.publish(context);
  } catch (error) {
    return settleError(running.deps, claim, toPhaselineError(error), emptyPayload(), notes);
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
      const next: JobRecord = { ...job, status: 'completed', outcome: result.outcome, lease: null, finishedAtMs: nowMs, phase: null };
      const summary = result.missing.length > 0 ? `Completed (partial; missing: ${result.missing.join(', ')})` : 'Completed';
      return { next, events: [...notes, { kind: 'completed', message: summary }], value: undefined };
    });
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    if (error instanceof UnresolvedEffectsError) return settleError(running.deps, claim, error, emptyPayload(), notes);
    throw error;
  }
  return { kind: 'completed', outcome: result.outcome };
}

// ---------------------------------------------------------------------------------------------
// Fan-out: the coordinating step writes one unit document per unit and hands the work to unit
// tasks; the job stays `running` without a lease while its units hold theirs. The unit that
// finishes last joins, in the same transaction that records it, so the join happens exactly once.

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
    sections: [],
    flusher: null,
    deadlineMs: Number.POSITIVE_INFINITY,
    budgetMs: 0,
    limits: stepLimits(store.options),
    durable: noDurableWrites('a fan-out coordinator'),
  });
  let unitIds: readonly string[];
  try {
    unitIds = [...new Set(fanOut.units(context))];
    const refusedUnit = unitIds.find((unit) => documentIdProblem(unit) !== null);
    if (refusedUnit !== undefined) throw new Error(`unit ID ${JSON.stringify(refusedUnit.slice(0, 140))} ${documentIdProblem(refusedUnit)}`);
  } catch (error) {
    return settleError(running.deps, claim, new TerminalError(`Phase ${phase.name} could not list its units: ${describeError(error)}`), emptyPayload(), notes);
  }
  const nowMs = store.clock.now();
  const toEnqueue: UnitRecord[] = [];
  try {
    await store.asOwner(claim, async ({ tx, job }) => {
      const refs = unitIds.map((unit) => store.unitRef(job.id, unit));
      const snapshots = refs.length > 0 ? await tx.getAll(...refs) : [];
      let done = 0;
      toEnqueue.length = 0;
      snapshots.forEach((snapshot, position) => {
        const unit = unitIds[position] as string;
        const existing = snapshot.exists ? decodeUnit(snapshot.ref.path, snapshot.data()) : null;
        // A unit finished under an earlier fan-out is reused as it is, if its result still validates.
        const reusable = existing?.status === 'done' && fanOut.unitState.safeParse(existing.result).success;
        const record: UnitRecord = {
          jobId: job.id,
          unit,
          phase: phase.name,
          fanoutEpoch: claim.epoch,
          status: reusable ? 'done' : 'queued',
          epoch: existing?.epoch ?? 0,
          lease: null,
          step: (existing?.step ?? -1) + 1,
          dispatch: 0,
          attempts: 0,
          staleReclaims: existing?.staleReclaims ?? 0,
          nextRunAtMs: nowMs,
          progress: existing?.progress ?? {},
          cost: existing?.cost ?? {},
          result: reusable ? existing.result : null,
          lastError: null,
          updatedAtMs: nowMs,
        };
        if (reusable) done += 1;
        else toEnqueue.push(record);
        tx.set(snapshot.ref, encodeUnit(record));
      });
      const next: JobRecord = {
        ...job,
        lease: null,
        phase: phase.name,
        fanout: { phase: phase.name, epoch: claim.epoch, units: unitIds.length, done },
      };
      return { next, events: [...notes, { kind: 'fanned-out', message: `${phase.name}: ${unitIds.length} units (${done} reused)` }], value: undefined };
    });
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    throw error;
  }
  if (toEnqueue.length === 0) {
    // Every unit was reused: join right away under the coordinator's epoch.
    await joinFanOut(running, claim.jobId, claim.epoch, phase, emptyPayload(), null);
  }
  for (const unit of toEnqueue) {
    await enqueueQuietly(running.deps, { jobId: unit.jobId, step: unit.step, unit: unit.unit }, unitTaskId(unit.jobId, unit.fanoutEpoch, unit.unit, unit.step, 0), 0);
  }
  return { kind: 'fanned-out', phase: phase.name, units: unitIds.length };
}

async function runUnitStep(deps: RunnerDeps, task: StepTask, unitId: string): Promise<StepOutcome> {
  const { store } = deps;
  const worker = deps.worker ?? defaultWorkerName();
  const nowMs = store.clock.now();
  const jobRef = store.jobRef(task.jobId);
  const unitRef = store.unitRef(task.jobId, unitId);
  type UnitClaimResult = { job: JobRecord; unit: UnitRecord } | { reason: string; notYetDueMs?: number };
  const claimed = await store.retryingWrite(`unit claim ${task.jobId}/${unitId}`, () =>
    store.db.runTransaction(async (tx): Promise<UnitClaimResult> => {
      const [jobSnapshot, unitSnapshot] = await tx.getAll(jobRef, unitRef);
      if (!jobSnapshot?.exists || !unitSnapshot?.exists) return { reason: 'no such job or unit' };
      const job = decodeJob(task.jobId, jobSnapshot.data());
      const unit = decodeUnit(unitRef.path, unitSnapshot.data());
      if (job.status !== 'running' || job.fanout?.epoch !== unit.fanoutEpoch) return { reason: `job is ${job.status}, not in this unit's fan-out` };
      if (unit.status !== 'queued') return { reason: `unit is ${unit.status}` };
      if (unit.step !== task.step) return { reason: `task is for unit step ${task.step}, unit is at step ${unit.step}` };
      if (unit.nextRunAtMs > nowMs) return { reason: 'unit is backing off', notYetDueMs: unit.nextRunAtMs - nowMs };
      const epoch = unit.epoch + 1;
      const next: UnitRecord = { ...unit, status: 'running', epoch, lease: { epoch, worker, expiresAtMs: nowMs + store.options.leaseSeconds * 1000 } };
      store.commitUnit(tx, unitSnapshot, next);
      return { job, unit: next };
    }),
  );
  if (!('unit' in claimed)) {
    if (claimed.notYetDueMs !== undefined) return { kind: 'not-yet-due', retryAfterMs: claimed.notYetDueMs };
    return { kind: 'not-claimable', reason: claimed.reason };
  }
  const { job, unit } = claimed;
  const claim: UnitClaim = { jobId: job.id, unit: unit.unit, epoch: unit.epoch, fanoutEpoch: unit.fanoutEpoch };
  const pipeline = deps.pipelines.get(job.pipeline);
  const phase = pipeline?.phases.find((candidate) => candidate.name === unit.phase);
  const input = pipeline?.input.safeParse(job.input);
  if (!pipeline || !phase?.fanOut || !input?.success) {
    return failJobFromUnit(deps, claim, new TerminalError(`Unit ${unit.unit}: pipeline ${job.pipeline} has no fan-out phase ${unit.phase}, or the stored input no longer validates`));
  }
  const fanOut = phase.fanOut;
  const running: Running = { deps, worker, pipeline, input: input.data, decisions: job.decisions, controller: new AbortController() };
  const loaded = await loadCheckpoints(store.db, job.id, pipeline);
  const sections = await loadSections(store.db, job.id, phase, unit.unit);
  const flusher = startFlusher(running, (payload) =>
    store.asUnitOwner(claim, ({ unit: current }) =>
      Promise.resolve({
        nextUnit: { ...withPayload(current, payload), lease: { epoch: claim.epoch, worker, expiresAtMs: store.clock.now() + store.options.leaseSeconds * 1000 } },
        events: payload.notes,
        value: undefined,
      }),
    ),
  );
  const context = createStepContext({
    jobId: job.id,
    input: input.data,
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
    durable: durableWrites(running, { kind: 'unit', claim }, phase.name, unit.unit),
  });

  let outcome: Awaited<ReturnType<typeof fanOut.runUnit>>;
  try {
    outcome = await fanOut.runUnit(context, unit.unit);
  } catch (error) {
    const pending = await flusher.stop();
    if (running.controller.signal.aborted || error instanceof OwnershipLostError) return lost(running, error);
    return settleUnitError(deps, claim, toPhaselineError(error), pending);
  }
  const pending = await flusher.stop();
  if (running.controller.signal.aborted) return lost(running, running.controller.signal.reason);

  try {
    if (outcome.kind === 'yield') {
      const next = await store.asUnitOwner(claim, ({ unit: current }) => {
        const record: UnitRecord = { ...withPayload(current, pending), status: 'queued', lease: null, step: current.step + 1, dispatch: 0, nextRunAtMs: store.clock.now() };
        return Promise.resolve({ nextUnit: record, events: [...pending.notes, { kind: 'yielded', message: `${unit.unit}: continuing in a new step` }], value: record });
      });
      await enqueueQuietly(deps, { jobId: job.id, step: next.step, unit: next.unit }, unitTaskId(job.id, next.fanoutEpoch, next.unit, next.step, 0), 0);
      return { kind: 'unit-yielded', unit: unit.unit };
    }
    if (outcome.kind === 'wait') {
      await store.asUnitOwner(claim, ({ job, unit: current }) =>
        Promise.resolve({
          // The fan-out ends here; on resume it starts again, reusing finished units and recorded sections.
          next: {
            ...job,
            status: 'waiting' as const,
            fanout: null,
            lease: null,
            step: job.step + 1,
            dispatch: 0,
            waiting: { reason: outcome.reason, questionId: 'provider', question: outcome.question, options: [], untilMs: outcome.untilMs },
            nextRunAtMs: outcome.untilMs,
          },
          nextUnit: { ...withPayload(current, pending), status: 'queued' as const, lease: null },
          events: [...pending.notes, { kind: 'waiting', message: `${unit.unit}: ${outcome.question}` }],
          value: undefined,
        }),
      );
      return { kind: 'waiting', reason: outcome.reason };
    }
    const parsed = fanOut.unitState.safeParse(outcome.state);
    if (!parsed.success) {
      return await failJobFromUnit(deps, claim, new TerminalError(`Unit ${unit.unit} produced a result that fails its schema: ${z.prettifyError(parsed.error)}`));
    }
    const joined = await joinFanOut(running, job.id, claim.fanoutEpoch, phase, pending, { claim, result: parsed.data });
    return { kind: 'unit-done', unit: unit.unit, joined };
  } catch (error) {
    if (error instanceof OwnershipLostError) return lost(running, error);
    throw error;
  }
}

/**
 * Records a finished unit (when given) and, if it was the last one, joins: the phase checkpoint
 * from every unit's result and the job's hand-off to its next step, all in one transaction.
 */
async function joinFanOut(
  running: Running,
  jobId: string,
  fanoutEpoch: number,
  phase: PhaseDefinition<unknown, unknown>,
  pending: FlushPayload,
  finished: { readonly claim: UnitClaim; readonly result: unknown } | null,
): Promise<boolean> {
  const { store } = running.deps;
  const fanOut = phase.fanOut;
  if (!fanOut) throw new Error(`Phase ${phase.name} has no fan-out`);
  const nowMs = store.clock.now();
  const body = async ({ tx, job, unit }: { tx: FirebaseFirestore.Transaction; job: JobRecord; unit?: UnitRecord }) => {
    const fanout = job.fanout;
    if (fanout?.epoch !== fanoutEpoch) throw new OwnershipLostError(`Job ${jobId} is no longer in fan-out epoch ${fanoutEpoch}`);
    const done = fanout.done + (finished ? 1 : 0);
    const events: EventDraft[] = [...pending.notes];
    let next: JobRecord = { ...job, cost: addCounts(job.cost, addCounts(unit?.cost ?? {}, pending.cost)), fanout: { ...fanout, done } };
    let joined = false;
    if (done >= fanout.units) {
      const siblings = await store.db.collection(`jobs/${jobId}/units`).where('fanoutEpoch', '==', fanoutEpoch).get();
      const results = new Map<string, unknown>();
      for (const doc of siblings.docs) {
        const sibling = decodeUnit(doc.ref.path, doc.data());
        const result = finished && sibling.unit === finished.claim.unit ? finished.result : sibling.result;
        results.set(sibling.unit, fanOut.unitState.parse(result));
      }
      const loaded = await loadCheckpoints(store.db, jobId, running.pipeline);
      const context = createStepContext({
        jobId,
        input: running.input,
        decisions: running.decisions,
        unit: null,
        signal: running.controller.signal,
        clock: store.clock,
        random: running.deps.random,
        phase,
        states: loaded.states,
        sections: [],
        flusher: null,
        deadlineMs: Number.POSITIVE_INFINITY,
        budgetMs: 0,
        limits: stepLimits(store.options),
    durable: noDurableWrites('a join'),
      });
      const state = phase.state.parse(fanOut.join(results, context));
      tx.set(store.checkpointRef(jobId, phase.name), checkpointDocumentFor(phase, state, fanoutEpoch, nowMs));
      const index = running.pipeline.phases.findIndex((candidate) => candidate.name === phase.name);
      next = { ...next, status: 'queued', fanout: null, lease: null, phase: running.pipeline.phases[index + 1]?.name ?? phase.name, step: job.step + 1, dispatch: 0, attempts: 0, nextRunAtMs: nowMs };
      events.push({ kind: 'joined', message: `${phase.name}: all ${fanout.units} units finished` });
      joined = true;
    }
    return { next, events, value: { joined, next } };
  };
  let settled: { joined: boolean; next: JobRecord };
  if (finished) {
    settled = await store.asUnitOwner(finished.claim, async (context) => {
      const outcome = await body(context);
      const nextUnit: UnitRecord = { ...withPayload(context.unit, pending), status: 'done', lease: null, result: finished.result };
      return { ...outcome, nextUnit, events: [{ kind: 'unit-done', message: `${finished.claim.unit} finished` }, ...outcome.events] };
    });
  } else {
    settled = await store.transact(jobId, () => null, (context) => body(context));
  }
  if (settled.joined) {
    await enqueueQuietly(running.deps, { jobId, step: settled.next.step }, stepTaskId(jobId, settled.next.step, 0), 0);
  }
  return settled.joined;
}

async function settleUnitError(deps: RunnerDeps, claim: UnitClaim, error: PhaselineError, pending: FlushPayload): Promise<StepOutcome> {
  const { store } = deps;
  const nowMs = store.clock.now();
  const settled = await store.asUnitOwner<SettledError<UnitRecord>>(claim, ({ job, unit }) => {
    const decision = decideAfterError({ ...job, attempts: unit.attempts }, error, store.options, nowMs, deps.random);
    const lastError = { code: error.code, message: error.message, atMs: nowMs };
    if (decision.action === 'requeue') {
      const nextUnit: UnitRecord = { ...withPayload(unit, pending), status: 'queued', lease: null, attempts: decision.attempts, step: unit.step + 1, dispatch: 0, nextRunAtMs: decision.nextRunAtMs, lastError };
      return Promise.resolve({
        nextUnit,
        events: [...pending.notes, { kind: 'retrying', message: `${unit.unit}: attempt ${decision.attempts} failed (${error.code}: ${error.message})` }],
        value: { kind: 'requeued' as const, record: nextUnit, delayMs: decision.nextRunAtMs - nowMs, attempts: decision.attempts },
      });
    }
    const reason = `unit ${unit.unit}: ${decision.reason}`;
    const next: JobRecord = {
      ...job,
      status: 'failed',
      fanout: null,
      lease: null,
      finishedAtMs: nowMs,
      cost: addCounts(job.cost, addCounts(unit.cost, pending.cost)),
      lastError: { code: error.code, message: `${unit.unit}: ${error.message}`, retryable: error.retryable, atMs: nowMs },
    };
    const nextUnit: UnitRecord = { ...unit, status: 'queued', lease: null, lastError };
    return Promise.resolve({ next, nextUnit, events: [...pending.notes, { kind: 'failed', message: `Failed: ${reason}. Last error: ${error.message}` }], value: { kind: 'failed' as const, reason } });
  });
  if (settled.kind === 'requeued') {
    await enqueueQuietly(deps, { jobId: claim.jobId, step: settled.record.step, unit: claim.unit }, unitTaskId(claim.jobId, claim.fanoutEpoch, claim.unit, settled.record.step, 0), settled.delayMs);
    return { kind: 'requeued', attempts: settled.attempts, delayMs: settled.delayMs };
  }
  return settled;
}

function failJobFromUnit(deps: RunnerDeps, claim: UnitClaim, error: TerminalError): Promise<StepOutcome> {
  return settleUnitError(deps, claim, error, emptyPayload());
}
