/**
 * Operator actions: deliberate, named state changes a person makes, each one transaction with an
 * event on the job's timeline.
 */
import { describeError, OwnershipLostError, PhaselineError } from '../core/errors';
import type { JobRecord } from '../core/job';
import { jobDispatch, releaseJob, type Transition } from '../core/transitions';
import { decodeUnit } from '../store/codec';
import type { JobStore } from '../store/job-store';
import type { TaskQueuePort } from '../store/task-queue';
import { UNITS } from './indexed-queries';

/** The action does not apply to the job as it stands (wrong status, no such job). Nothing was written. */
export class OperatorActionRefusedError extends PhaselineError {
  constructor(message: string) {
    super('invalid_input', false, message);
  }
}

export interface ReleaseResult {
  readonly job: JobRecord;
  readonly taskId: string;
  /** False when the task could not be enqueued; the job is queued all the same and the sweeper dispatches it. */
  readonly enqueued: boolean;
}

/**
 * Sends a quarantined job back to the queue with a fresh budget: attempts and stale reclaims (its
 * own and its fan-out units') start again from zero, at a new step so no old task can claim it.
 * Any other status is refused with an OperatorActionRefusedError.
 */
export async function releaseQuarantined(
  store: JobStore,
  queue: TaskQueuePort,
  jobId: string,
  nowMs: number,
  log: (message: string, detail?: Record<string, unknown>) => void = (message, detail) => console.warn(message, detail),
): Promise<ReleaseResult> {
  let released: Transition<JobRecord>;
  try {
    released = await store.transactReading(
      jobId,
      () => null,
      async ({ tx, job }) => {
        if (job.status !== 'quarantined') {
          throw new OperatorActionRefusedError(`Job ${jobId} is ${job.status}; only a quarantined job can be released.`);
        }
        // Units keep their stale-reclaim count across fan-outs; a release is a fresh start for them too.
        const units = await tx.get(store.jobRef(jobId).collection(UNITS));
        for (const snapshot of units.docs) {
          const unit = decodeUnit(snapshot.ref.path, snapshot.data());
          if (unit.status !== 'done' && unit.staleReclaims > 0) store.commitUnit(tx, snapshot, { ...unit, staleReclaims: 0 });
        }
        const released = releaseJob(job, nowMs);
        return { next: released.next, events: released.events, value: released };
      },
    );
  } catch (error) {
    // With a check that never refuses, the store reports only a missing job this way.
    if (error instanceof OwnershipLostError) throw new OperatorActionRefusedError(`Job ${jobId} cannot be released: ${error.message}`);
    throw error;
  }
  const dispatch = jobDispatch(released.next);
  try {
    await queue.enqueue(dispatch.task, { id: dispatch.id });
    return { job: released.next, taskId: dispatch.id, enqueued: true };
  } catch (error) {
    log('release: the job is queued but its task could not be enqueued; the sweeper will dispatch it', { jobId, taskId: dispatch.id, error: describeError(error) });
    return { job: released.next, taskId: dispatch.id, enqueued: false };
  }
}
