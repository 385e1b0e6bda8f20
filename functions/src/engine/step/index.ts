/** One task = one bounded step: parse the payload (record and acknowledge what cannot be understood), then run a job step or a unit step. */
import { z } from 'zod';
import { OwnershipLostError, UnreadableJobError } from '../../core/errors';
import { documentId } from '../../core/ids';
import { type StepTask } from '../../core/job';
import { endUnreadableJob } from '../../store/unreadable-jobs';
import { PHASE_NAME_PATTERN } from '../../core/pipeline';
import { runClaimedStep } from './claim';
import { recordRejectedTask, type RunnerDeps, type StepOutcome } from './deps';

// The one check for IDs from outside (core/ids): the fan-out below lists units by the same rule, so its tasks are never refused.
export const firestoreId = documentId('ID');

export const phaseName = z.string().regex(PHASE_NAME_PATTERN, 'must be a kebab-case phase name');

export const stepTaskSchema = z
  .strictObject({ jobId: firestoreId, step: z.number().int().nonnegative(), unit: firestoreId.optional(), phase: phaseName.optional() })
  .refine((task) => (task.unit === undefined) === (task.phase === undefined), 'a unit task names both its unit and its phase; a job task names neither');

/** Entry point for one delivered task. Never throws for a task that should not be redelivered. */
export async function runStep(deps: RunnerDeps, payload: unknown): Promise<StepOutcome> {
  const parsed = stepTaskSchema.safeParse(payload);
  if (!parsed.success) {
    return recordRejectedTask(deps, payload, `Malformed task payload: ${z.prettifyError(parsed.error)}`);
  }
  // The store enqueues each committed change's tasks: to this step's queue.
  deps = { ...deps, store: deps.store.dispatchingTo(deps.queue, deps.log) };
  const { jobId, step, unit, phase } = parsed.data;
  const task: StepTask = unit === undefined || phase === undefined ? { jobId, step } : { jobId, step, unit, phase };
  try {
    return await runClaimedStep(deps, task);
  } catch (error) {
    if (error instanceof OwnershipLostError) return { kind: 'ownership-lost', reason: error.message };
    if (error instanceof UnreadableJobError) return endUnreadable(deps, error);
    throw error;
  }
}

/**
 * The job's document cannot be read: a redelivery would meet the same document, so the task ends
 * the job where it stands (with the reason) and is acknowledged. Only a document repaired
 * meanwhile is left to the redelivery.
 */
async function endUnreadable(deps: RunnerDeps, error: UnreadableJobError): Promise<StepOutcome> {
  const ending = await endUnreadableJob(deps.store, error);
  if (ending === 'readable') throw error;
  deps.log?.('job document cannot be read; ended where it stands', { jobId: error.jobId, reason: error.message, ending });
  const what = ending === 'quarantined' ? 'quarantined it' : ending === 'cleared' ? 'it had ended; took it out of the sweeps' : 'it was ended already';
  return { kind: 'not-claimable', reason: `Job ${error.jobId} cannot be read (${error.message}): ${what}` };
}
