/** Pure decisions about job state changes; the store applies them in transactions. */
import { TerminalError, type PhaselineError } from './errors';
import { ENDED_STATUSES, type JobRecord, type JobWait, type LeaseHolder } from './job';
import type { DecisionWait, ProviderWait } from './pipeline';
import { takeoverAgeMs, type EngineOptions } from './options';
import type { RandomSource } from './clock';
import { capServerDelay } from './server-delay';

export type ClaimDecision =
  | { readonly claimable: true }
  | { readonly claimable: false; readonly reason: string; readonly notYetDueMs?: number };

/** Whether a task for `step` may claim this job (or unit: `noun` names it in the reason) now. */
export function decideClaim(holder: Pick<LeaseHolder, 'status' | 'step' | 'nextRunAtMs'>, step: number, nowMs: number, noun: 'job' | 'unit' = 'job'): ClaimDecision {
  if (holder.status !== 'queued') return { claimable: false, reason: `${noun} is ${holder.status}` };
  if (holder.step !== step) return { claimable: false, reason: `task is for step ${step}, ${noun} is at step ${holder.step}` };
  if (holder.nextRunAtMs > nowMs) {
    return { claimable: false, reason: `${noun} is backing off`, notYetDueMs: holder.nextRunAtMs - nowMs };
  }
  return { claimable: true };
}

/** Full-jitter exponential backoff, never sooner than the error's own retry-after (already capped by the caller). */
export function backoffDelayMs(attempt: number, options: EngineOptions, random: RandomSource, retryAfterMs = 0): number {
  const ceilingMs = Math.min(options.backoffMaxSeconds, options.backoffBaseSeconds * 2 ** Math.max(0, attempt - 1)) * 1000;
  return Math.max(retryAfterMs, Math.floor(random() * ceilingMs));
}

export type ErrorDecision =
  | { readonly action: 'requeue'; readonly attempts: number; readonly nextRunAtMs: number }
  /**
   * The server asked for a delay past `maxServerDelaySeconds`: an outage, not a retry. The job
   * waits until the cap (a stated resume time); the wait spends an attempt, so it is bounded.
   */
  | { readonly action: 'wait'; readonly attempts: number; readonly untilMs: number; readonly reason: string }
  | { readonly action: 'fail'; readonly attempts: number; readonly reason: string };

export function decideAfterError(
  job: Pick<JobRecord, 'attempts'>,
  error: PhaselineError,
  options: EngineOptions,
  nowMs: number,
  random: RandomSource,
): ErrorDecision {
  const attempts = job.attempts + 1;
  if (!error.retryable) return { action: 'fail', attempts, reason: `terminal error (${error.code})` };
  const serverDelay = capServerDelay(error.retryAfterMs, options.maxServerDelaySeconds * 1000);
  // An outage spends an attempt like any error, so a service that never comes back ends the job
  // (failed, with the reason) after maxAttempts waits instead of waiting for ever.
  if (serverDelay.capped && attempts < options.maxAttempts) {
    const untilMs = nowMs + serverDelay.delayMs;
    return {
      action: 'wait',
      attempts,
      untilMs,
      reason:
        `the service asked to wait ${describeDelay(serverDelay.requestedMs)}, longer than the ${options.maxServerDelaySeconds} s cap; ` +
        `treated as an outage, resuming by itself at ${new Date(untilMs).toISOString()}`,
    };
  }
  if (attempts >= options.maxAttempts) {
    return { action: 'fail', attempts, reason: `retry budget spent (${attempts} of ${options.maxAttempts} attempts)` };
  }
  return { action: 'requeue', attempts, nextRunAtMs: nowMs + backoffDelayMs(attempts, options, random, serverDelay.delayMs) };
}

function describeDelay(ms: number): string {
  const seconds = ms / 1000;
  if (seconds < 3 * 86_400) return `${Math.round(seconds)} s`;
  const days = seconds / 86_400;
  return days < 3_650 ? `${Math.round(days)} days` : 'more than ten years';
}

export type ExpiredLeaseDecision =
  | { readonly action: 'requeue'; readonly staleReclaims: number }
  | { readonly action: 'quarantine'; readonly staleReclaims: number; readonly reason: string };

/** A lease that expired means the worker died or hung: count it, and stop retrying a job that keeps doing it. */
export function decideExpiredLease(holder: Pick<LeaseHolder, 'staleReclaims'>, options: EngineOptions): ExpiredLeaseDecision {
  const staleReclaims = holder.staleReclaims + 1;
  if (staleReclaims > options.maxStaleReclaims) {
    return {
      action: 'quarantine',
      staleReclaims,
      reason: `its lease expired ${staleReclaims} times (limit ${options.maxStaleReclaims}): it keeps killing or hanging its workers`,
    };
  }
  return { action: 'requeue', staleReclaims };
}

/**
 * The stored wait for a phase's wait outcome. The contract holds by construction: a decision wait
 * has no resume time (it never times out into a default), a provider wait always has one (it never
 * waits forever). Outcomes that break it (a JavaScript pipeline bypassing the types) are refused.
 */
export function waitRecord(outcome: DecisionWait | ProviderWait): JobWait {
  if (outcome.reason === 'decision') {
    if ((outcome as { untilMs?: unknown }).untilMs !== undefined) {
      throw new TerminalError(`A decision wait (${outcome.questionId}) cannot carry a resume time: a person's question never times out into a default`);
    }
    const options: readonly string[] = outcome.options;
    if (options.length === 0) throw new TerminalError(`A decision wait (${outcome.questionId}) needs at least one option to answer with`);
    return { reason: 'decision', questionId: outcome.questionId, question: outcome.question, options: [...options], untilMs: null };
  }
  const untilMs: unknown = outcome.untilMs;
  if (typeof untilMs !== 'number' || !Number.isFinite(untilMs)) {
    throw new TerminalError(`A provider wait (${outcome.questionId}) needs a finite resume time, got ${String(untilMs)}: it would wait forever`);
  }
  return { reason: 'provider', questionId: outcome.questionId, question: outcome.question, options: [], untilMs };
}

/** The question a job at its owner's spend cap asks, and its answers (`cancel` is the cancel action). */
export const BUDGET_QUESTION_ID = 'budget';
export const BUDGET_RESUME = 'resume';
export const BUDGET_CANCEL = 'cancel';

/**
 * The wait of a job whose owner reached the daily spend cap: it resumes by itself when the day's
 * spend resets, and its owner may resume it sooner (once an operator raised the cap) or cancel it.
 */
export function budgetWait(reached: { readonly message: string; readonly resetAtMs: number }): JobWait {
  return {
    reason: 'budget',
    questionId: BUDGET_QUESTION_ID,
    question: `${reached.message} The job waits and resumes by itself then; resume it sooner if the limit was raised, or cancel it.`,
    options: [BUDGET_RESUME, BUDGET_CANCEL],
    untilMs: reached.resetAtMs,
  };
}

export type TakeoverDecision =
  /** The holder heartbeated recently: it may be alive. Ask for a redelivery after `retryAfterMs`. */
  | { readonly action: 'redeliver-later'; readonly retryAfterMs: number; readonly reason: string }
  | { readonly action: 'take-over'; readonly staleReclaims: number; readonly reason: string }
  | { readonly action: 'quarantine'; readonly staleReclaims: number; readonly reason: string };

/**
 * A task found its own step still held. Cloud Tasks redelivers a task whose request failed (the
 * worker crashed or was killed), so this usually means the holder is dead: if its heartbeat is
 * older than `takeoverAgeMs` (or its lease ran out) the task takes over at once, counted
 * as a lost worker like any reclaim. A fresh heartbeat means the holder may be alive and only
 * slow to answer: the task asks to be redelivered once the heartbeat would be stale.
 */
export function decideStaleTakeover(holder: Pick<LeaseHolder, 'lease' | 'staleReclaims'>, nowMs: number, options: EngineOptions): TakeoverDecision | null {
  const lease = holder.lease;
  if (lease === null) return null;
  const renewedAtMs = lease.renewedAtMs ?? lease.expiresAtMs - options.leaseSeconds * 1000;
  const ageMs = nowMs - renewedAtMs;
  // The holder stopped at the stale age on its own clock; the allowance covers a taker's clock ahead of it.
  const staleMs = takeoverAgeMs(options);
  if (ageMs < staleMs && lease.expiresAtMs > nowMs) {
    return {
      action: 'redeliver-later',
      retryAfterMs: Math.min(staleMs - ageMs, lease.expiresAtMs - nowMs),
      reason: `held by ${lease.worker} (epoch ${lease.epoch}), last heartbeat ${Math.round(ageMs / 1000)} s ago`,
    };
  }
  const why =
    lease.expiresAtMs <= nowMs
      ? `the lease of epoch ${lease.epoch} held by ${lease.worker} had expired`
      : `no heartbeat from ${lease.worker} (epoch ${lease.epoch}) for ${Math.round(ageMs / 1000)} s (limit ${staleMs / 1000} s)`;
  const decision = decideExpiredLease(holder, options);
  if (decision.action === 'quarantine') return { action: 'quarantine', staleReclaims: decision.staleReclaims, reason: decision.reason };
  return {
    action: 'take-over',
    staleReclaims: decision.staleReclaims,
    reason: `${why}: a redelivered task took over (lost worker ${decision.staleReclaims} of at most ${options.maxStaleReclaims})`,
  };
}

const DAY_MS = 86_400_000;

/** When a document that belongs to a job ended at `endedAtMs` (or a task rejected then) expires. */
export function expireAtMs(endedAtMs: number, retentionDays: number): number {
  return endedAtMs + retentionDays * DAY_MS;
}

/** When the job ended, for retention: its finish time (every ending transition sets it), else when its stamping became due. */
export function endedAtMs(job: Pick<JobRecord, 'finishedAtMs' | 'retention' | 'updatedAtMs'>): number {
  return job.finishedAtMs ?? job.retention?.dueAtMs ?? job.updatedAtMs;
}

/**
 * The record a commit writes, with its retention stamping made due when the commit ends the job
 * (a move into an ended status). Stamping hundreds of child documents cannot be part of that
 * commit, so the record carries the work to do and the sweeper does it (engine/retention.ts).
 */
export function withRetentionDue(current: Pick<JobRecord, 'status'>, next: JobRecord, nowMs: number): JobRecord {
  if (!ENDED_STATUSES.has(next.status) || ENDED_STATUSES.has(current.status) || next.retention) return next;
  return { ...next, retention: { dueAtMs: next.finishedAtMs ?? nowMs, cursor: null } };
}
