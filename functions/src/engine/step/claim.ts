/**
 * The path every step takes before it works: claim the job or the unit (or take over a silent
 * holder), load the pipeline and the stored input, refuse a job started on a newer version of its
 * pipeline; then a job routes by stored state (publication, a fan-out start, a phase) and a unit runs.
 */
import { z } from 'zod';
import type { JobClaim, UnitClaim } from '../../core/claims';
import { OwnershipLostError, TerminalError, type PhaselineError } from '../../core/errors';
import { quarantineViaUnit } from '../../core/fan-out-moves';
import { EMPTY_FLUSH } from '../../core/flusher';
import { type JobRecord, type StepTask, type UnitRecord } from '../../core/job';
import { claimJob, claimUnit, takeOverJob, takeOverUnit, TransitionRefused, type Transition } from '../../core/transitions';
import { resumePhaseIndex, type PhaseDefinition, type PipelineDefinition } from '../../core/pipeline';
import { readCheckpointDocuments } from '../../store/checkpoint-reads';
import type { Change } from '../../store/door';
import { fanOutMoveChange } from '../ended-fan-out';
import { loadCheckpoints, NewerVersionError } from '../checkpoints';
import { ClaimScope } from './claim-scope';
import { defaultWorkerName, recordRejectedTask, type RunnerDeps, type StepOutcome } from './deps';
import { startFanOut } from './fan-out';
import { runPhase } from './phase-step';
import { complete } from './publication';
import { errorDecision, settle, type Holding, type JobHolder, type UnitHolder } from './settle';
import { runUnit } from './unit-step';

/** A claim the task could not take, and why (`notYetDueMs`: ask again that much later). */
interface NotClaimed {
  readonly reason: string;
  readonly notYetDueMs?: number;
}

type Claimed<H> = { readonly holder: H; readonly job: JobRecord; readonly unit: UnitRecord | null };

function notClaimed(refused: TransitionRefused): NotClaimed {
  return refused.notYetDueMs === undefined ? { reason: refused.message } : { reason: refused.message, notYetDueMs: refused.notYetDueMs };
}

function notClaimedOutcome(refused: NotClaimed): StepOutcome {
  return refused.notYetDueMs !== undefined ? { kind: 'not-yet-due', retryAfterMs: refused.notYetDueMs } : { kind: 'not-claimable', reason: refused.reason };
}

/** A transition's refusal as the claim's value; anything else goes on. */
function refusedClaim<T>(claim: () => T): T | NotClaimed {
  try {
    return claim();
  } catch (error) {
    if (!(error instanceof TransitionRefused)) throw error;
    return notClaimed(error);
  }
}

/** Runs one task's step: its claim, its pipeline, its work. */
export async function runClaimedStep(deps: RunnerDeps, task: StepTask): Promise<StepOutcome> {
  const worker = deps.worker ?? defaultWorkerName();
  if (task.unit !== undefined && task.phase !== undefined) {
    const claimed = await takeUnit(deps, task, task.unit, task.phase, worker);
    if (!('holder' in claimed)) return claimed;
    const opened = openWork({ deps, holder: claimed.holder }, claimed, worker);
    if ('settled' in opened) return opened.settled;
    const phase = opened.pipeline.phases.find((candidate) => candidate.name === claimed.holder.claim.phase);
    if (!phase?.fanOut) return settle({ deps, holder: claimed.holder }, EMPTY_FLUSH, errorDecision({ deps, holder: claimed.holder }, new TerminalError(`Unit ${claimed.holder.claim.unit}: pipeline ${claimed.job.pipeline} has no fan-out phase ${claimed.holder.claim.phase}`)));
    return runUnit(new ClaimScope(deps, claimed.holder, opened), phase);
  }
  /**
   * The checkpoint documents, read beside the claim's commit, not after it: every write of a
   * checkpoint also rewrites the job under its precondition, so a checkpoint that changed after the
   * job was read fails this claim (and the read is made again with the next decision), and once the
   * claim landed no older holder can write one. Only the checkpoints: sections are fenced by the
   * claim slot, not the job, so whatever else is read (the resume phase's sections, for their
   * versions) is read after the claim landed.
   */
  const checkpoints: { read: ReturnType<typeof readCheckpointDocuments> | null } = { read: null };
  const claimed = await takeJob(deps, task, worker, checkpoints);
  if (!('holder' in claimed)) return claimed;
  const opened = openWork({ deps, holder: claimed.holder }, claimed, worker);
  if ('settled' in opened) return opened.settled;
  return routeJob(new ClaimScope(deps, claimed.holder, opened), checkpoints.read ?? undefined);
}

/** Claims a queued job, or takes over this task's own step from a holder gone silent. */
async function takeJob(deps: RunnerDeps, task: StepTask, worker: string, checkpoints: { read: ReturnType<typeof readCheckpointDocuments> | null }): Promise<Claimed<JobHolder> | StepOutcome> {
  const { store } = deps;
  const nowMs = store.clock.now();
  const input = { step: task.step, worker, options: store.options };
  let claimed: JobRecord | NotClaimed;
  try {
    claimed = await store.apply({ kind: 'job-record', jobId: task.jobId }, ({ job }): Change<JobRecord | NotClaimed> => {
      // A queued job is claimed; this task's own step still held after a crash is taken over once its holder went silent.
      const claim = refusedClaim<Transition<JobRecord>>(() => (job.status === 'running' && job.step === task.step ? takeOverJob(job, input, nowMs) : claimJob(job, input, nowMs)));
      if (!('next' in claim)) return { value: claim };
      const taken = claim.next.status === 'running';
      checkpoints.read = taken ? readCheckpointDocuments(store, job.id) : null;
      checkpoints.read?.catch(() => undefined);
      return { next: claim.next, events: claim.events, value: taken ? claim.next : { reason: `job ${claim.next.status}: ${claim.events[0]?.message ?? ''}` } };
    });
  } catch (error) {
    if (error instanceof OwnershipLostError) return recordRejectedTask(deps, task, `No such job: ${task.jobId}`);
    throw error;
  }
  if ('reason' in claimed) return notClaimedOutcome(claimed);
  const claim: JobClaim = { jobId: claimed.id, epoch: claimed.epoch };
  return { holder: { kind: 'job', claim }, job: claimed, unit: null };
}

/**
 * Claims a queued unit, or takes over this task's own unit step from a holder gone silent (which may
 * quarantine the job: the unit lost too many workers). Read, decide, then one commit conditioned on
 * the unit and its claim slot (and the job when it is written): no transaction, no lock on the job.
 */
async function takeUnit(deps: RunnerDeps, task: StepTask, unitId: string, phaseName: string, worker: string): Promise<Claimed<UnitHolder> | StepOutcome> {
  const { store } = deps;
  const nowMs = store.clock.now();
  const input = { step: task.step, worker, options: store.options };
  let claimed: { job: JobRecord; unit: UnitRecord } | NotClaimed;
  try {
    claimed = await store.apply({ kind: 'unit-record', keys: { jobId: task.jobId, phase: phaseName, unit: unitId } }, async ({ job, unit }): Promise<Change<{ job: JobRecord; unit: UnitRecord } | NotClaimed>> => {
      const claim = refusedClaim<Transition<UnitRecord> & { readonly quarantine?: string }>(() => (unit.status === 'running' && unit.step === task.step ? takeOverUnit(job, unit, input, nowMs) : claimUnit(job, unit, input, nowMs)));
      if (!('next' in claim)) return { value: claim };
      const { quarantine } = claim;
      if (quarantine !== undefined) {
        return { ...(await fanOutMoveChange(store, job, (others) => quarantineViaUnit(job, { ...claim, quarantine }, others, nowMs))), value: { reason: `job quarantined: ${quarantine}` } };
      }
      // A takeover is told on the job's timeline; a plain claim stays off the hot job document.
      const told = claim.events.length > 0 ? { next: job, events: claim.events } : {};
      return { nextUnit: claim.next, ...told, value: { job, unit: claim.next } };
    });
  } catch (error) {
    if (!(error instanceof OwnershipLostError)) throw error;
    return { kind: 'not-claimable', reason: 'no such job or unit' };
  }
  if ('reason' in claimed) return notClaimedOutcome(claimed);
  const { job, unit } = claimed;
  const claim: UnitClaim = { jobId: job.id, phase: unit.phase, unit: unit.unit, epoch: unit.epoch, fanoutEpoch: unit.fanoutEpoch };
  return { holder: { kind: 'unit', claim }, job, unit };
}

/**
 * The pipeline this worker runs the claimed work with, and its stored input. A job (or unit) whose
 * pipeline is unknown or whose input no longer validates fails; one started on a newer version of its
 * pipeline is left to a worker of that version (a rolling deploy, a rollback): never run by an older one.
 */
function openWork(holding: Holding, claimed: Claimed<unknown>, worker: string): { worker: string; pipeline: PipelineDefinition<unknown>; input: unknown; job: JobRecord; unit: UnitRecord | null } | { settled: Promise<StepOutcome> } {
  const { job } = claimed;
  const refuse = (error: PhaselineError) => ({ settled: settle(holding, EMPTY_FLUSH, errorDecision(holding, error)) });
  const pipeline = holding.deps.pipelines.get(job.pipeline);
  if (!pipeline) return refuse(new TerminalError(`Unknown pipeline ${job.pipeline}`));
  const input = pipeline.input.safeParse(job.input);
  if (!input.success) return refuse(new TerminalError(`Stored input fails the ${pipeline.name} schema: ${z.prettifyError(input.error)}`));
  const startedOn = job.pipelineVersion ?? 1;
  if (startedOn > (pipeline.version ?? 1)) {
    return refuse(new NewerVersionError(`Job ${job.id} started on version ${startedOn} of ${pipeline.name}; this worker runs version ${pipeline.version ?? 1} and leaves it to a newer one`));
  }
  return { worker, pipeline, input: input.data, job, unit: claimed.unit };
}

/** A claimed job goes where its stored state says: publication once every phase is checkpointed, else its resume phase (a fan-out or a phase). */
async function routeJob(scope: ClaimScope<JobHolder>, checkpointsRead: ReturnType<typeof readCheckpointDocuments> | undefined): Promise<StepOutcome> {
  const { pipeline, job } = scope.work;
  const loaded = await loadCheckpoints(scope.deps.store, job.id, pipeline, checkpointsRead);
  for (const refusal of loaded.refused) scope.notes.push({ kind: 'checkpoint-refused', message: `Stored checkpoint of ${refusal.phase} failed validation and will be redone: ${refusal.reason}` });
  // Stored state this worker's pipeline version cannot read (refused, or written by a newer version): settled with the reason at once, never run around.
  if (loaded.unreadable) return settle(scope, EMPTY_FLUSH, errorDecision(scope, loaded.unreadable, scope.notes));
  const index = resumePhaseIndex(pipeline, new Set(loaded.states.keys()));
  if (index >= pipeline.phases.length) return complete(scope, loaded.states);
  const phase = pipeline.phases[index] as PhaseDefinition<unknown, unknown>;
  if (job.phase !== null && job.phase !== phase.name) {
    scope.notes.push({ kind: 'resumed', message: `Resuming at ${phase.name} (the job pointed at ${job.phase}; stored state decides)` });
  }
  if (phase.fanOut) return startFanOut(scope, phase, loaded.states);
  return runPhase(scope, phase, index, loaded.states);
}
