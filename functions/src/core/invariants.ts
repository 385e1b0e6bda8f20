/**
 * "Nothing sits in `running` forever", made checkable. Every non-terminal job must be one of:
 *
 * - `running` with a lease (its worker heartbeats; when it stops, the lease expires and the
 *   sweeper or an early reclaim takes the job back);
 * - `running` without a lease, in a fan-out that has at least one unit queued or leased (the
 *   unit's task, or the sweeper's lost-task and expired-lease rules, move it on);
 * - `queued` with a finite due time (its task claims it; if the task is lost the sweeper
 *   re-dispatches it once the grace period has passed);
 * - `waiting` for a person (no resume time: a person answers) or for a provider (a finite resume
 *   time the sweeper acts on).
 *
 * Tests and the chaos soak run `strandedReason` over every job; a non-null answer is a job that
 * nothing will ever move again.
 */
import { TERMINAL_STATUSES, type JobRecord, type Lease } from './job';

export interface UnitView {
  readonly unit: string;
  readonly phase: string;
  readonly fanoutEpoch: number;
  readonly status: 'queued' | 'running' | 'done';
  readonly lease: Lease | null;
  readonly nextRunAtMs: number;
}

export function strandedReason(job: JobRecord, units: readonly UnitView[]): string | null {
  if (TERMINAL_STATUSES.has(job.status)) return null;
  switch (job.status) {
    case 'running': {
      if (job.lease !== null) return null;
      const fanout = job.fanout;
      if (fanout === null) return 'running with neither a lease nor a fan-out';
      const live = units.filter(
        (unit) =>
          unit.fanoutEpoch === fanout.epoch &&
          unit.phase === fanout.phase &&
          ((unit.status === 'queued' && Number.isFinite(unit.nextRunAtMs)) || (unit.status === 'running' && unit.lease !== null)),
      );
      return live.length > 0 ? null : `running in fan-out ${fanout.phase} (epoch ${fanout.epoch}) with no queued or leased unit`;
    }
    case 'queued':
      return Number.isFinite(job.nextRunAtMs) ? null : 'queued without a due time';
    case 'waiting': {
      const wait = job.waiting;
      if (wait === null) return 'waiting without a wait record';
      if (wait.reason === 'decision') return wait.untilMs === null ? null : 'a decision wait with a resume time (it would time out into a default)';
      return wait.untilMs !== null && Number.isFinite(wait.untilMs) ? null : 'a provider wait without a resume time (it would wait forever)';
    }
    default:
      return null;
  }
}
