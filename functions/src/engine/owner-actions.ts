/**
 * What a job's owner can do to it after submitting: cancel it, and answer the question it waits
 * on. Each is one change through the store's door (JobStore.apply), decided from the job as read
 * and committed conditioned on it (and, for a cancel, on the effect entries and fan-out units it
 * was decided from): no lock is taken, so a client that dies deciding holds nobody up.
 */
import { PhaselineError } from '../core/errors';
import { TERMINAL_STATUSES, type Cancellation, type JobRecord } from '../core/job';
import { BUDGET_CANCEL, BUDGET_QUESTION_ID } from '../core/lifecycle';
import { chargeFanOut } from '../core/fan-out-moves';
import { cancelJobRecord, decideWaitingJob, TransitionRefused, type Transition } from '../core/transitions';
import { DEFAULT_SETTLE_GRACE_MS } from '../effects/after-stop';
import { countEffectStates, EFFECT_STATES, type EffectState } from '../effects/ledger';
import { cancellationReport } from '../effects/stop-report';
import type { DocumentWrite } from '../store/door';
import { effectMarkedUnknown, effectUnchanged, readEffectVersions } from '../store/effect-access';
import type { JobStore } from '../store/job-store';
import type { TaskQueuePort } from '../store/task-queue';

/** Why an owner action was refused; `status` is the HTTP status that says it. */
export class OwnerActionError extends PhaselineError {
  constructor(
    readonly status: 404 | 409 | 403 | 400,
    message: string,
  ) {
    super('invalid_input', false, message);
  }
}

/** Effect states as the ledger records them (see the effects module). */
export const IN_FLIGHT_EFFECT_STATE: EffectState = 'applying';
export const UNKNOWN_EFFECT_STATE: EffectState = 'unknown';
/** States an entry of a running job cannot leave: a cancel need not fence them. */
const SETTLED_EFFECT_STATES: readonly unknown[] = ['applied', 'failed'] satisfies EffectState[];

export interface CancelResult {
  readonly job: JobRecord;
  /** Effects that were in flight and are now `unknown` until reconciled. */
  readonly unknownEffects: number;
}

function ownedJob(job: JobRecord, owner: string): void {
  // A job someone else owns is reported as missing: its existence is not theirs to learn.
  if (job.owner !== owner) throw new OwnerActionError(404, `No job ${job.id}`);
}

/**
 * The fan-out a cancel ends: the job charged every unit's cost it has not counted yet; the units
 * charged are rewritten under the update time read, the others fenced on it, so a unit that
 * records more before the cancel lands fails the commit, which is decided again with it.
 */
async function endedFanOutOf(store: JobStore, job: JobRecord): Promise<{ job: JobRecord; documents: DocumentWrite[] }> {
  const fanout = job.fanout;
  if (fanout === null) return { job, documents: [] };
  const reads = (await store.readFanOutUnits(job.id, fanout.epoch)).filter(({ record }) => record.phase === fanout.phase);
  const { job: charged, charged: written } = chargeFanOut(job, fanout, reads.map(({ record }) => record));
  const documents = reads.map((read): DocumentWrite => {
    const next = written.find((unit) => unit.unit === read.record.unit);
    const path = store.unitRef(job.id, read.record.phase, read.record.unit).path;
    return next ? { kind: 'unit', read, next } : { kind: 'unchanged', read: { path, updateTime: read.updateTime }, field: 'fanoutEpoch', value: read.record.fanoutEpoch };
  });
  return { job: charged, documents };
}

export async function cancelJob(
  store: JobStore,
  /** `by` names the operator cancelling on the owner's behalf; absent when the owner cancels. */
  request: { jobId: string; owner: string; reason: string; by?: string },
  /** Refuses the cancel (by throwing) unless the job as read is the one the caller means to cancel. */
  expect?: (job: JobRecord) => void,
): Promise<CancelResult> {
  const nowMs = store.clock.now();
  try {
    return await store.apply({ kind: 'job-record', jobId: request.jobId }, async ({ job }) => {
      ownedJob(job, request.owner);
      if (TERMINAL_STATUSES.has(job.status)) throw new OwnerActionError(409, `Job ${job.id} is already ${job.status}`);
      expect?.(job);
      const ledger = await readEffectVersions(store, job.id);
      // A fan-out the cancel ends: its units' recorded cost goes into the job's in this commit.
      const fanOut = await endedFanOutOf(store, job);
      const documents: DocumentWrite[] = [...fanOut.documents];
      const states: EffectState[] = [];
      let unknownEffects = 0;
      for (const effect of ledger) {
        const { state } = effect;
        if (state === IN_FLIGHT_EFFECT_STATE) {
          // Its outcome is not known until someone checks with the system of record.
          // The apply will not be answered to anyone who may record it: counted as one without a usable answer.
          documents.push(effectMarkedUnknown(effect, { state: UNKNOWN_EFFECT_STATE, unknownSinceMs: nowMs, unknownBecause: 'cancelled while in flight' }));
          unknownEffects += 1;
          states.push(UNKNOWN_EFFECT_STATE);
          continue;
        }
        // An entry the running job may still move (planned, unknown) is counted as read: the commit is fenced on it.
        if (!SETTLED_EFFECT_STATES.includes(state)) documents.push(effectUnchanged(effect));
        if ((EFFECT_STATES as readonly unknown[]).includes(state)) states.push(state as EffectState);
      }
      const counts = countEffectStates(states.map((state) => ({ state })));
      const settled = counts.applying + counts.unknown === 0;
      const cancellation: Cancellation = {
        atMs: nowMs,
        reason: request.reason,
        by: request.by ?? null,
        phase: job.phase,
        sectionsDone: job.progress.sectionsDone ?? null,
        effects: ledger.length === 0 ? null : { counts, settled, checkedWith: null, checkedAtMs: null },
      };
      // The sweeper checks what nobody knows yet with the system of record, once the grace period is over. A job that
      // has sent effects is checked in any case: an entry planned after the read above may have gone out without
      // writing the job again (only its first send marks it), and the check finds it.
      const check = !settled || job.effectsToSettleAtMs !== null;
      const cancelled = cancelJobRecord(fanOut.job, { cancellation, message: cancellationReport(cancellation), effectsToSettleAtMs: check ? nowMs + DEFAULT_SETTLE_GRACE_MS : null }, nowMs);
      return { next: cancelled.next, events: cancelled.events, documents, value: { job: cancelled.next, unknownEffects } };
    });
  } catch (error) {
    if (error instanceof PhaselineError && error.code === 'ownership_lost') throw new OwnerActionError(404, `No job ${request.jobId}`);
    throw error;
  }
}

export async function decideJob(
  store: JobStore,
  queue: TaskQueuePort,
  request: { jobId: string; owner: string; questionId: string; answer: string },
  /** Why the owner may no longer make this job go on (its pipeline's access policy), or null; the stop option of the budget wait is always theirs. */
  mayGoOn: (job: JobRecord) => string | null = () => null,
): Promise<JobRecord> {
  if (request.questionId === BUDGET_QUESTION_ID && request.answer === BUDGET_CANCEL) {
    // The spend limit wait's other option: stop the job where it is.
    const cancelled = await cancelJob(store, { jobId: request.jobId, owner: request.owner, reason: 'stopped by its owner at the daily spend limit' }, (job) => {
      if (job.status !== 'waiting' || job.waiting?.reason !== 'budget') throw new OwnerActionError(409, `Job ${job.id} is not waiting at its spend limit (it is ${job.status})`);
    });
    return cancelled.job;
  }
  const nowMs = store.clock.now();
  try {
    // The store enqueues the decided job's task once the decision is durable (the sweeper re-dispatches one that went missing).
    return await store.dispatchingTo(queue).apply({ kind: 'job-record', jobId: request.jobId }, ({ job }) => {
      ownedJob(job, request.owner);
      const refusal = mayGoOn(job);
      if (refusal !== null) throw new OwnerActionError(403, refusal);
      let decided: Transition<JobRecord>;
      try {
        decided = decideWaitingJob(job, { questionId: request.questionId, answer: request.answer }, nowMs);
      } catch (error) {
        if (error instanceof TransitionRefused) throw new OwnerActionError(409, error.message);
        throw error;
      }
      const options = job.waiting?.options ?? [];
      if (!options.includes(request.answer)) {
        throw new OwnerActionError(400, `"${request.answer}" is not one of the options: ${options.map((option) => `"${option}"`).join(', ')}`);
      }
      return { next: decided.next, events: decided.events, dispatch: decided.dispatch, value: decided.next };
    });
  } catch (error) {
    if (error instanceof PhaselineError && error.code === 'ownership_lost') throw new OwnerActionError(404, `No job ${request.jobId}`);
    throw error;
  }
}
