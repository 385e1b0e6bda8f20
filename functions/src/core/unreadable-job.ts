/**
 * A job whose document the codec refuses is ended where it stands, from its raw status alone
 * (store/unreadable-jobs.ts writes the few fields the sweeps and readers key on): one that had not
 * ended is quarantined (JOB_TRANSITIONS.quarantineUnreadable); an ended one keeps its status.
 */
import { ENDED_STATUSES, type JobStatus } from './job';
import { JOB_TRANSITIONS } from './transitions';

export interface UnreadableJobEnd {
  /** It had ended already (its status is one of the ended ones). */
  readonly ended: boolean;
  /** The status it is put into, or null: it keeps the one it has. */
  readonly quarantinedAs: JobStatus | null;
}

export function unreadableJobEnd(status: unknown): UnreadableJobEnd {
  const ended = typeof status === 'string' && ENDED_STATUSES.has(status as JobStatus);
  const [quarantined] = JOB_TRANSITIONS.quarantineUnreadable.to;
  return { ended, quarantinedAs: !ended && status !== quarantined ? quarantined : null };
}
