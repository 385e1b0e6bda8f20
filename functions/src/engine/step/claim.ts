/** Claim and routing: take the job (or take over a silent holder), then route to publication, a fan-out start or a phase step by stored state. */
import { z } from 'zod';
import { OwnershipLostError, TerminalError } from '../../core/errors';
import { EMPTY_FLUSH } from '../../core/flusher';
import { type JobRecord, type StepTask } from '../../core/job';
import { claimJob, takeOverJob, TransitionRefused, type Transition } from '../../core/transitions';
import { resumePhaseIndex, type PhaseDefinition } from '../../core/pipeline';
import { readCheckpointDocuments } from '../../store/checkpoint-reads';
import type { JobClaim } from '../../core/claims';
import type { EventDraft } from '../../store/door';
import { JOB_CLAIM_SLOT } from '../../store/paths';
import { stepChargeScope } from '../spend-meter';
import { loadCheckpoints, NewerVersionError } from '../checkpoints';
import { startFanOut } from './fan-out';
import { runPhase } from './phase-step';
import { complete } from './publication';
import { defaultWorkerName, newRunning, recordRejectedTask, type RunnerDeps, type StepOutcome } from './running';
import { settleError } from './settle';

export type ClaimResult = { job: JobRecord } | { reason: string; notYetDueMs?: number };

export async function runJobStep(deps: RunnerDeps, task: StepTask): Promise<StepOutcome> {
  const { store } = deps;
  const worker = deps.worker ?? defaultWorkerName();
  const nowMs = store.clock.now();
  let claimed: ClaimResult;
  /**
   * The checkpoint documents, read beside the claim's commit, not after it: every write of a
   * checkpoint also rewrites the job under its precondition, so a checkpoint that changed after the
   * job was read fails this claim (and the read is made again with the next decision), and once the
   * claim landed no older holder can write one. Only the checkpoints: sections are fenced by the
   * claim slot, not the job, so whatever else is read (the resume phase's sections, for their
   * versions) is read after the claim landed.
   */
  const checkpoints: { read: ReturnType<typeof readCheckpointDocuments> | null } = { read: null };
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
      checkpoints.read = 'job' in value ? readCheckpointDocuments(store, job.id) : null;
      checkpoints.read?.catch(() => undefined);
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
  // A job started on a newer version of its pipeline is left to a worker of that version (a rolling deploy, a rollback): never run by an older one.
  const startedOn = job.pipelineVersion ?? 1;
  if (startedOn > (pipeline.version ?? 1)) {
    return settleError(deps, claim, new NewerVersionError(`Job ${job.id} started on version ${startedOn} of ${pipeline.name}; this worker runs version ${pipeline.version ?? 1} and leaves it to a newer one`), EMPTY_FLUSH);
  }
  const running = newRunning(deps, worker, pipeline, input.data, job, stepChargeScope(job.id, JOB_CLAIM_SLOT, job.epoch));

  const loaded = await loadCheckpoints(store, job.id, pipeline, checkpoints.read ?? undefined);
  const refusedNotes: EventDraft[] = loaded.refused.map((refusal) => ({
    kind: 'checkpoint-refused',
    message: `Stored checkpoint of ${refusal.phase} failed validation and will be redone: ${refusal.reason}`,
  }));
  // Stored state this worker's pipeline version cannot read (refused, or written by a newer version): settled with the reason at once, never run around.
  if (loaded.unreadable) return settleError(deps, claim, loaded.unreadable, EMPTY_FLUSH, refusedNotes);
  const index = resumePhaseIndex(pipeline, new Set(loaded.states.keys()));
  if (index >= pipeline.phases.length) return complete(running, claim, loaded.states, refusedNotes);

  const phase = pipeline.phases[index] as PhaseDefinition<unknown, unknown>;
  if (job.phase !== null && job.phase !== phase.name) {
    refusedNotes.push({ kind: 'resumed', message: `Resuming at ${phase.name} (the job pointed at ${job.phase}; stored state decides)` });
  }
  if (phase.fanOut) return startFanOut(running, claim, phase, loaded.states, refusedNotes);
  return runPhase(running, claim, phase, index, loaded.states, refusedNotes);
}
