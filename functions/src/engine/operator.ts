/**
 * Operator actions: deliberate, named state changes a person makes, each one change through the
 * store's door (JobStore.apply) with an event on the job's timeline. Each decides from the job and
 * the documents it reads beside it (effect entries, units, what a re-drive moves), and commits
 * conditioned on the update time of every one of them: no lock is taken, so an operator's client
 * that dies deciding holds no sweeper and no worker up.
 */
import { describeError, OwnershipLostError, PhaselineError } from '../core/errors';
import type { Cancellation, JobRecord, JobStatus } from '../core/job';
import type { PipelineRegistry } from '../core/pipeline';
import { chargeUnits, JOB_TRANSITIONS, jobDispatch, redriveJobRecord, releaseJob, type Transition } from '../core/transitions';
import type { Change, DocumentWrite } from '../store/door';
import type { JobStore } from '../store/job-store';
import { countSetAside, readEarlierAttempt, readOutbox, readSetAsidePage, setAsidePrefix, SET_ASIDE, setAsideWrites, type SetAsideMark } from '../store/phase-documents';
import type { TaskQueuePort } from '../store/task-queue';
import { failedBecauseStopped } from '../effects/after-stop';
import { parseEffectEntry } from '../store/firestore-ledger';
import { effectMarkedUnknown, readEffectVersions, type EffectVersion } from '../store/effect-access';
import { clearExpiryStamps } from '../store/retention';
import { UNKNOWN_EFFECT_STATE } from './owner-actions';

/**
 * The entries of a stopped job's ledger that the stopped-effects pass closed as not applied only
 * because the job had stopped (effects/after-stop.ts): a job that runs again (released, re-driven)
 * must not skip them. Read beside the job by the change that sends it back to the queue.
 */
async function effectsClosedByTheStop(store: JobStore, jobId: string): Promise<EffectVersion[]> {
  // Only entries settled as failed can have been closed by the stop; the others are not read (nor judged).
  const ledger = await readEffectVersions(store, jobId, ['failed']);
  return ledger.filter((effect) => failedBecauseStopped(parseEffectEntry(effect.read.path, effect.data)));
}

/** Reopens them as `unknown`, in that commit, each under the update time read: the job that runs again looks each one up before it sends it (once, under its key). */
function reopenEffects(entries: readonly EffectVersion[], nowMs: number): DocumentWrite[] {
  return entries.map((effect) =>
    effectMarkedUnknown(effect, { state: UNKNOWN_EFFECT_STATE, unknownSinceMs: nowMs, unknownBecause: 'not applied when the job stopped; the job that runs again looks it up before sending it' }),
  );
}

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
 * A fan-out still on record ends here (the released job starts its own), its units' uncounted cost
 * charged to the job; effects the stopped-effects pass closed only because the job had stopped are
 * reopened, so the released job looks them up and sends what never arrived.
 * Any other status is refused with an OperatorActionRefusedError.
 */
export async function releaseQuarantined(
  store: JobStore,
  queue: TaskQueuePort,
  jobId: string,
  nowMs: number,
  log: (message: string, detail?: Record<string, unknown>) => void = (message, detail) => console.warn(message, detail),
  /** Who releases it, for the job's timeline (the console's operator uid, the CLI's login). */
  by: string | null = null,
): Promise<ReleaseResult> {
  const dispatching = watchingEnqueue(store, queue, (message, detail) => log(message, { jobId, ...detail }), 'release');
  let released: Transition<JobRecord>;
  try {
    released = await dispatching.store.apply({ kind: 'job-record', jobId }, async ({ job }) => {
      if (job.status !== 'quarantined') {
        throw new OperatorActionRefusedError(`Job ${jobId} is ${job.status}; only a quarantined job can be released.`);
      }
      // A re-drive that stopped between its pages has set part of the job aside: released now, it would run on half its state.
      const interrupted = await readEarlierAttempt(store, jobId, { redrive: (job.redrive?.count ?? 0) + 1, epoch: job.epoch });
      if (interrupted !== null) {
        throw new OperatorActionRefusedError(`An interrupted re-drive of job ${jobId} from ${interrupted} already set some of its documents aside; run it again from ${interrupted} to finish it, rather than releasing the job.`);
      }
      const closedByTheStop = await effectsClosedByTheStop(store, jobId);
      // Units keep their stale-reclaim count across fan-outs; a release is a fresh start for them too.
      const units = await store.readJobUnits(jobId);
      // Whatever a unit recorded that the job has not counted (a fan-out a quarantine left on record) is counted now, once.
      const { job: charged, charged: chargedUnits } = chargeUnits(job, units.map(({ record }) => record));
      const documents: DocumentWrite[] = [];
      for (const read of units) {
        const unit = read.record;
        const next = chargedUnits.find((candidate) => candidate.unit === unit.unit && candidate.phase === unit.phase) ?? unit;
        const fresh = next.status !== 'done' && next.staleReclaims > 0 ? { ...next, staleReclaims: 0 } : next;
        if (fresh !== unit) documents.push({ kind: 'unit', read, next: fresh });
      }
      documents.push(...reopenEffects(closedByTheStop, nowMs));
      const released = releaseJob(charged, nowMs, by);
      return { next: released.next, events: released.events, documents, dispatch: released.dispatch, value: released };
    });
  } catch (error) {
    // The decision never refuses this way: the store reports only a missing job so.
    if (error instanceof OwnershipLostError) throw new OperatorActionRefusedError(`Job ${jobId} cannot be released: ${error.message}`);
    throw error;
  }
  return { job: released.next, taskId: jobDispatch(released.next).id, enqueued: dispatching.enqueued() };
}

/**
 * The store, enqueueing what its commit dispatches to `queue` and telling whether that worked: a
 * failure leaves the job queued all the same (the sweeper dispatches it), and the operator's answer says so.
 */
function watchingEnqueue(store: JobStore, queue: TaskQueuePort, log: (message: string, detail?: Record<string, unknown>) => void, action: string): { store: JobStore; enqueued: () => boolean } {
  let failed = false;
  const watched: TaskQueuePort = {
    async enqueue(task, options) {
      try {
        await queue.enqueue(task, options);
      } catch (error) {
        failed = true;
        throw error;
      }
    },
  };
  const logFailure = (_message: string, detail?: Record<string, unknown>) => log(`${action}: the job is queued but its task could not be enqueued; the sweeper will dispatch it`, detail);
  return { store: store.dispatchingTo(watched, logFailure), enqueued: () => !failed };
}

// ---- Re-drive ---------------------------------------------------------------------------------

export interface RedriveRequest {
  readonly jobId: string;
  /** The phase to run again: it and every later phase are set aside and redone. */
  readonly fromPhase: string;
  /** Who re-drives it (an operator's uid or name) and why: both go on the job's timeline. */
  readonly by: string;
  readonly reason: string;
}

export interface RedriveResult {
  readonly job: JobRecord;
  readonly taskId: string;
  /** False when the task could not be enqueued; the job is queued all the same and the sweeper dispatches it. */
  readonly enqueued: boolean;
  /** Documents set aside, and the prefix of their IDs under `jobs/{id}/setAside`. */
  readonly setAside: number;
  readonly auditPrefix: string;
  /** Where the job resumes: `fromPhase`, or an earlier phase it never finished. */
  readonly resumesAt: string;
}

export interface RedriveOptions {
  /** The pipelines whose phases the re-drive names (only their phase lists are read): the caller's registry, the deployed one in production. */
  readonly pipelines: PipelineRegistry;
  /** Documents moved per commit (tests use a small one to exercise paging); never more than MAX_SET_ASIDE_PER_COMMIT. */
  readonly pageSize?: number;
  readonly log?: (message: string, detail?: Record<string, unknown>) => void;
}

/**
 * Documents one commit sets aside at most. A commit holds at most 500 writes; each document costs
 * up to three (its copy, its removal or a unit's parking, that unit's claim slot), and the last
 * commit also writes the job, its event, the published answer's move and any fan-out revocations.
 */
export const MAX_SET_ASIDE_PER_COMMIT = 150;
/** Bytes of copies one commit carries at most (a request is limited to 10 MiB; transcripts can be large). */
export const MAX_SET_ASIDE_BYTES_PER_COMMIT = 6 * 1024 * 1024;
const MAX_COMMIT_WRITES = 500;
const MAX_BY_LENGTH = 200;
const MAX_REASON_LENGTH = 1_000;

/** One commit of a re-drive: a page set aside, or the last commit, with its transition. */
interface RedriveStep {
  readonly done?: { readonly transition: Transition<JobRecord>; readonly resumesAt: string; readonly setAside: number };
}

const REDRIVABLE: readonly JobStatus[] = JOB_TRANSITIONS.redrive.from;

/** Why a job in this status cannot be re-driven, or null when it can. */
export function redriveRefusal(job: Pick<JobRecord, 'id' | 'status'> & { readonly cancellation?: Pick<Cancellation, 'by'> | null }): string | null {
  if (REDRIVABLE.includes(job.status)) return null;
  if (job.status === 'cancelled') {
    const by = job.cancellation?.by;
    if (by) return `Job ${job.id} was cancelled by operator ${by}; a re-drive would resume the work (and the effects) that cancel stopped. Its owner can submit it again.`;
    return `Job ${job.id} was cancelled by its owner; a re-drive would resume the work (and the effects) they stopped. They can submit it again.`;
  }
  return `Job ${job.id} is ${job.status}; only a completed, failed or quarantined job can be re-driven (a ${job.status} job is still in the engine's hands).`;
}

/**
 * Restarts a completed, failed or quarantined job from a named phase. Everything that phase and the
 * later ones stored (checkpoints, fan-out units, sections, their transcripts and drafts) is set
 * aside for audit, and so is the published answer, so that the re-run publishes its own; the effect
 * ledger stays as it is, so an effect already applied is found applied and never sent again, and
 * one whose outcome was unknown is looked up before anything is retried. The job goes back to the
 * queue at a new step with fresh budgets, its timeline saying who re-drove it and why.
 *
 * The last commit sets aside what is left and moves the job, decided from the job and what it
 * moves as read, and conditioned on each one's update time (a change since is decided again): when
 * everything fits in one commit (MAX_SET_ASIDE_PER_COMMIT documents), that is the only one. More is
 * set aside in pages first, each a commit that checks the job is still as it was (still ended, not
 * re-driven since), the last phase first; running the same re-drive again after
 * an interruption goes on where it stopped, and one from another phase is refused until then.
 * Refusals (an unknown job, pipeline or phase, a status that does not allow it, no reason given) are
 * OperatorActionRefusedError.
 */
export async function redriveJob(store: JobStore, queue: TaskQueuePort, request: RedriveRequest, nowMs: number, options: RedriveOptions): Promise<RedriveResult> {
  const by = request.by.trim();
  const reason = request.reason.trim();
  if (by === '' || by.length > MAX_BY_LENGTH) throw new OperatorActionRefusedError(`A re-drive names who makes it (by): 1 to ${MAX_BY_LENGTH} characters.`);
  if (reason === '' || reason.length > MAX_REASON_LENGTH) throw new OperatorActionRefusedError(`A re-drive says why (reason, 1 to ${MAX_REASON_LENGTH} characters): the job's timeline keeps it.`);
  const job = await store.read(request.jobId);
  if (!job) throw new OperatorActionRefusedError(`Job ${request.jobId} does not exist.`);
  const refusal = redriveRefusal(job);
  if (refusal !== null) throw new OperatorActionRefusedError(refusal);
  const pipeline = options.pipelines.get(job.pipeline);
  if (!pipeline) throw new OperatorActionRefusedError(`Job ${job.id} belongs to pipeline ${job.pipeline}, which this deployment does not have.`);
  const index = pipeline.phases.findIndex((phase) => phase.name === request.fromPhase);
  if (index === -1) {
    throw new OperatorActionRefusedError(`Pipeline ${pipeline.name} has no phase "${request.fromPhase}"; its phases are ${pipeline.phases.map((phase) => phase.name).join(', ')}.`);
  }
  const phases = pipeline.phases.slice(index).map((phase) => phase.name);
  const earlierPhases = pipeline.phases.slice(0, index).map((phase) => phase.name);
  const mark: SetAsideMark = { redrive: (job.redrive?.count ?? 0) + 1, epoch: job.epoch, fromPhase: request.fromPhase, by, atMs: nowMs };
  const auditPrefix = setAsidePrefix(mark);
  const pageSize = Math.max(1, Math.min(options.pageSize ?? MAX_SET_ASIDE_PER_COMMIT, MAX_SET_ASIDE_PER_COMMIT));

  const log = options.log ?? ((message: string, detail?: Record<string, unknown>) => console.warn(message, detail));
  const dispatching = watchingEnqueue(store, queue, (message, detail) => log(message, { jobId: job.id, ...detail }), 're-drive');
  for (;;) {
    let step: RedriveStep;
    try {
      step = await dispatching.store.apply({ kind: 'job-record', jobId: job.id }, async ({ job: current }): Promise<Change<RedriveStep>> => {
        // Still the job this re-drive was decided on: ended the same way, not re-driven or run since.
        const changed = redriveRefusal(current) ?? (current.epoch !== mark.epoch || (current.redrive?.count ?? 0) !== mark.redrive - 1 ? `Job ${job.id} changed while it was being re-driven (it is ${current.status} at epoch ${current.epoch}); nothing more was set aside.` : null);
        if (changed !== null) throw new OperatorActionRefusedError(changed);
        const earlier = await readEarlierAttempt(store, job.id, mark);
        if (earlier !== null && earlier !== request.fromPhase) {
          throw new OperatorActionRefusedError(
            `An interrupted re-drive of job ${job.id} from ${earlier} already set some of its documents aside (${SET_ASIDE}/${auditPrefix}…); run it again from ${earlier} to finish it.`,
          );
        }
        // Effects the stopped-effects pass closed as not applied because the job had stopped: the re-run may send them, after a lookup.
        const reopened = await effectsClosedByTheStop(store, job.id);
        const reserve = 4 + (current.fanout?.unitIds?.length ?? 0) + reopened.length;
        const size = Math.min(pageSize, Math.floor((MAX_COMMIT_WRITES - reserve) / 3));
        const page = await readSetAsidePage(store, job.id, phases, size, MAX_SET_ASIDE_BYTES_PER_COMMIT);
        // A page of its own: the job is rewritten as read, so its precondition fences the page.
        if (page.full) return { documents: setAsideWrites(store, job.id, mark, page.documents), value: {} };
        const outbox = await readOutbox(store, current);
        // The phases before it are only read: the job has ended, so no claim can write their checkpoints.
        const kept = await Promise.all(earlierPhases.map((phase) => store.checkpointRef(job.id, phase).get()));
        const resumesAt = earlierPhases[kept.findIndex((snapshot) => !snapshot.exists)] ?? request.fromPhase;
        // Earlier pages, this attempt's and an interrupted one's, count too (only a re-drive of this job writes them, under its precondition).
        const before = await countSetAside(store, job.id, mark);
        const documents = outbox ? [...page.documents, outbox] : page.documents;
        const setAside = before + documents.length;
        const transition = redriveJobRecord(current, { fromPhase: request.fromPhase, by, reason, setAside, auditPrefix, resumesAt }, nowMs);
        return {
          next: transition.next,
          events: transition.events,
          documents: [...setAsideWrites(store, job.id, mark, documents), ...reopenEffects(reopened, nowMs)],
          dispatch: transition.dispatch,
          value: { done: { transition, resumesAt, setAside } },
        };
      });
    } catch (error) {
      if (error instanceof OwnershipLostError) throw new OperatorActionRefusedError(`Job ${job.id} cannot be re-driven: ${error.message}`);
      throw error;
    }
    if (step.done === undefined) continue;
    const { transition, resumesAt, setAside } = step.done;
    const result = { job: transition.next, taskId: jobDispatch(transition.next).id, setAside, auditPrefix, resumesAt, enqueued: dispatching.enqueued() };
    // The sweeper may have stamped the ended job's timeline to expire: the stamps come off, or TTL would delete it under the re-run.
    // (The commit above cleared the job's retention marker, so no sweep stamps it again until it ends.)
    try {
      await clearExpiryStamps(store, job.id);
    } catch (error) {
      log('re-drive: the retention stamps of the job could not all be removed; they are renewed when it ends again', { jobId: job.id, error: describeError(error) });
    }
    return result;
  }
}
