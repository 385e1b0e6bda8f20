/**
 * What a job's owner can do to it after submitting: cancel it, and answer the question it waits
 * on. Each is one transaction on the job document.
 */
import { PhaselineError } from '../core/errors';
import { TERMINAL_STATUSES, type Cancellation, type JobRecord } from '../core/job';
import { BUDGET_CANCEL, BUDGET_QUESTION_ID } from '../core/lifecycle';
import { cancelJobRecord, decideWaitingJob, TransitionRefused, type Transition } from '../core/transitions';
import { DEFAULT_SETTLE_GRACE_MS } from '../effects/after-stop';
import { countEffectStates, EFFECT_STATES, type EffectState } from '../effects/ledger';
import { cancellationReport } from '../effects/stop-report';
import { markEffectUnknown } from '../store/effect-access';
import { chargeEndedFanOut } from './ended-fan-out';
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

export interface CancelResult {
  readonly job: JobRecord;
  /** Effects that were in flight and are now `unknown` until reconciled. */
  readonly unknownEffects: number;
}

function ownedJob(job: JobRecord, owner: string): void {
  // A job someone else owns is reported as missing: its existence is not theirs to learn.
  if (job.owner !== owner) throw new OwnerActionError(404, `No job ${job.id}`);
}

export async function cancelJob(
  store: JobStore,
  /** `by` names the operator cancelling on the owner's behalf; absent when the owner cancels. */
  request: { jobId: string; owner: string; reason: string; by?: string },
  /** Refuses the cancel (by throwing) unless the job as read is the one the caller means to cancel. */
  expect?: (job: JobRecord) => void,
): Promise<CancelResult> {
  const nowMs = store.clock.now();
  const effects = store.jobRef(request.jobId).collection('effects');
  try {
    return await store.transactReading(
      request.jobId,
      () => null,
      async ({ tx, job }) => {
        ownedJob(job, request.owner);
        if (TERMINAL_STATUSES.has(job.status)) throw new OwnerActionError(409, `Job ${job.id} is already ${job.status}`);
        expect?.(job);
        const ledger = await tx.get(effects);
        // A fan-out the cancel ends: its units' recorded cost goes into the job's in this commit (read before any write).
        const charged = await chargeEndedFanOut(store, tx, job, job.fanout, { transaction: tx });
        const states: EffectState[] = [];
        let unknownEffects = 0;
        for (const effect of ledger.docs) {
          const state: unknown = effect.get('state');
          if (state === IN_FLIGHT_EFFECT_STATE) {
            // Its outcome is not known until someone checks with the system of record.
            // The apply will not be answered to anyone who may record it: counted as one without a usable answer.
            markEffectUnknown(tx, effect.ref, { state: UNKNOWN_EFFECT_STATE, unknownSinceMs: nowMs, unknownBecause: 'cancelled while in flight' });
            unknownEffects += 1;
            states.push(UNKNOWN_EFFECT_STATE);
          } else if ((EFFECT_STATES as readonly unknown[]).includes(state)) {
            states.push(state as EffectState);
          }
        }
        const counts = countEffectStates(states.map((state) => ({ state })));
        const settled = counts.applying + counts.unknown === 0;
        const cancellation: Cancellation = {
          atMs: nowMs,
          reason: request.reason,
          by: request.by ?? null,
          phase: job.phase,
          sectionsDone: job.progress.sectionsDone ?? null,
          effects: ledger.empty ? null : { counts, settled, checkedWith: null, checkedAtMs: null },
        };
        // The sweeper checks what nobody knows yet with the system of record, once the grace period is over.
        const cancelled = cancelJobRecord(charged, { cancellation, message: cancellationReport(cancellation), effectsToSettleAtMs: settled ? null : nowMs + DEFAULT_SETTLE_GRACE_MS }, nowMs);
        return { next: cancelled.next, events: cancelled.events, value: { job: cancelled.next, unknownEffects } };
      },
    );
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
  let decided: Transition<JobRecord>;
  try {
    decided = await store.transact(
      request.jobId,
      () => null,
      ({ job }) => {
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
        return Promise.resolve({ next: decided.next, events: decided.events, value: decided });
      },
    );
  } catch (error) {
    if (error instanceof PhaselineError && error.code === 'ownership_lost') throw new OwnerActionError(404, `No job ${request.jobId}`);
    throw error;
  }
  const dispatch = decided.dispatch;
  try {
    if (dispatch) await queue.enqueue(dispatch.task, { id: dispatch.id });
  } catch {
    // Durable already; the sweeper re-dispatches a queued job whose task went missing.
  }
  return decided.next;
}
