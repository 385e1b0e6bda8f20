/**
 * How the first finder ends a job whose document the codec refuses (store/unreadable-jobs.ts
 * writes the fields raw, since no record can be decoded): a job that had not ended is quarantined
 * (JOB_TRANSITIONS.quarantineUnreadable), an ended one keeps its status.
 */
import { ENDED_STATUSES, type JobStatus } from './job';
import { JOB_TRANSITIONS } from './transitions';

export interface UnreadableJobEnding {
  /** It had ended already (completed, failed, cancelled). */
  readonly ended: boolean;
  /** It is quarantined now. */
  readonly quarantine: boolean;
  /** Its status after the ending, as stored (an ended job's is left as it was). */
  readonly status: unknown;
}

/** The ending of an unreadable job whose stored status is `status` (whatever it holds). */
export function endUnreadableJobStatus(status: unknown): UnreadableJobEnding {
  const ended = typeof status === 'string' && ENDED_STATUSES.has(status as JobStatus);
  const quarantine = !ended && status !== 'quarantined';
  const [quarantined] = JOB_TRANSITIONS.quarantineUnreadable.to;
  return { ended, quarantine, status: quarantine ? quarantined : status };
}
