/**
 * Limits per user at submit: how many of a user's jobs may be in flight at once, and how many
 * submissions they may make in a sliding minute. Pure: the store reads the user's usage record,
 * the operator's override and the statuses of the jobs the record lists, and this decides.
 *
 * A job holds its slot until it ends (completed, failed or cancelled) or is quarantined: a
 * quarantined job runs no more unless an operator releases it, and its owner cannot cancel it, so
 * counting it would lock the user out until someone acts. A waiting job still holds one. Slots are given back lazily, at the user's next submit,
 * by reading the listed jobs' statuses, so the engine changes nothing when a job ends and a worker
 * that dies leaks no slot.
 *
 * The third limit is model spend per user and UTC day, in USD, counting every call the provider
 * billed, wasted ones included. It is charged by the steps as calls come back (a document per user
 * and day, `quotaUsage/{uid}/spendDays/{day}`), checked before every model call (a running job at
 * its cap waits, reason `budget`) and at submit (a user at their cap is refused until the day ends).
 */
import { z } from 'zod';
import type { JobStatus } from './job';

export const QUOTA_LIMITS = ['jobs_in_flight', 'submits_per_minute', 'spend_per_day', 'anonymous_jobs_in_flight'] as const;
/** Which limit refused a submission: the machine-readable `limit` of a 429 answer. */
export type QuotaLimit = (typeof QUOTA_LIMITS)[number];

export interface UserLimits {
  readonly jobsInFlight: number;
  readonly submitsPerMinute: number;
  /** Model spend per UTC day in USD, wasted calls included. */
  readonly spendUsdPerDay: number;
}

/** The limits of a user the operator has not given limits of their own, by kind of account. */
export interface QuotaDefaults {
  readonly signedIn: UserLimits;
  /** Firebase anonymous accounts (`sign_in_provider` "anonymous"): anyone can make one, so lower. */
  readonly anonymous: UserLimits;
  /**
   * Jobs of all anonymous accounts together that may be in flight at once: a limit per account
   * means nothing to someone who makes fresh accounts. Absent: no such ceiling.
   */
  readonly anonymousJobsInFlightTotal?: number;
}

export const DEFAULT_ANONYMOUS_JOBS_IN_FLIGHT_TOTAL = 20;

export const DEFAULT_QUOTA_DEFAULTS: QuotaDefaults = {
  signedIn: { jobsInFlight: 3, submitsPerMinute: 10, spendUsdPerDay: 10 },
  anonymous: { jobsInFlight: 1, submitsPerMinute: 3, spendUsdPerDay: 1 },
  anonymousJobsInFlightTotal: DEFAULT_ANONYMOUS_JOBS_IN_FLIGHT_TOTAL,
};

/** The ceiling's in-flight jobs are listed in one document and, when it is full, their statuses are read at an anonymous submit: this bounds both. */
export const MAX_ANONYMOUS_JOBS_IN_FLIGHT_TOTAL = 500;

/**
 * Every listed job's status is read in the submit transaction, so the in-flight limit bounds
 * those reads; each submission in the window is one timestamp in the usage document, and each
 * accepted one is a write to it (Firestore sustains about one write a second per document).
 */
export const MAX_JOBS_IN_FLIGHT = 100;
export const MAX_SUBMITS_PER_MINUTE = 600;
/** A cap above any plausible day of one user's model calls; an operator sets it to lift the cap in effect. */
export const MAX_SPEND_USD_PER_DAY = 1_000_000;

export const SUBMIT_WINDOW_MS = 60_000;
/** When a slot frees is unknown (a job runs for minutes): a client that honours Retry-After checks back this often. */
export const IN_FLIGHT_RETRY_AFTER_SECONDS = 30;

/**
 * Statuses in which a job holds no slot: those it never leaves, and quarantined (it runs no more
 * by itself, and its owner cannot cancel it; an operator's release may take the user past a limit,
 * which is the operator's call).
 */
export const SLOT_FREE_STATUSES: ReadonlySet<JobStatus> = new Set(['completed', 'failed', 'cancelled', 'quarantined']);

const jobsInFlight = z.int().min(0).max(MAX_JOBS_IN_FLIGHT);
const submitsPerMinute = z.int().min(0).max(MAX_SUBMITS_PER_MINUTE);
const spendUsdPerDay = z.number().min(0).max(MAX_SPEND_USD_PER_DAY);

/**
 * `userLimits/{uid}`, written by operators only: each limit it names replaces the default for that
 * user; a limit it leaves out keeps the default. Unknown fields are kept and ignored, so a later
 * field does not break this reader and an operator's change does not drop it.
 */
export const userLimitsOverrideSchema = z.looseObject({
  jobsInFlight: jobsInFlight.optional(),
  submitsPerMinute: submitsPerMinute.optional(),
  // No upper bound here: an override written before the bound existed still reads (the tools and settings keep to it).
  spendUsdPerDay: z.number().min(0).optional(),
  updatedAtMs: z.number().optional(),
});
export type UserLimitsOverride = z.infer<typeof userLimitsOverrideSchema>;

export const userLimitsSchema = z.strictObject({ jobsInFlight, submitsPerMinute, spendUsdPerDay });

/**
 * `quotaUsage/{uid}`, written only in the transaction that creates one of the user's jobs: the
 * jobs that may still hold a slot, and when the submissions of the last minute were accepted.
 */
export const quotaUsageSchema = z.object({
  inFlightJobIds: z.array(z.string()),
  recentSubmitsAtMs: z.array(z.number()),
  updatedAtMs: z.number(),
  /**
   * Whether the account was anonymous at its last submit: the steps of its jobs read it to know
   * which default spend cap applies. Absent on records written before the cap: signed-in.
   */
  anonymous: z.boolean().optional(),
});
export type QuotaUsage = z.infer<typeof quotaUsageSchema>;

export const EMPTY_QUOTA_USAGE: QuotaUsage = { inFlightJobIds: [], recentSubmitsAtMs: [], updatedAtMs: 0 };

export function limitsFor(defaults: QuotaDefaults, anonymous: boolean, override: UserLimitsOverride | null): UserLimits {
  const base = anonymous ? defaults.anonymous : defaults.signedIn;
  return {
    jobsInFlight: override?.jobsInFlight ?? base.jobsInFlight,
    submitsPerMinute: override?.submitsPerMinute ?? base.submitsPerMinute,
    spendUsdPerDay: override?.spendUsdPerDay ?? base.spendUsdPerDay,
  };
}

// ---- Spend per user and day -------------------------------------------------------------------

const DAY_MS = 86_400_000;

/** The UTC day a call's spend counts against, as `YYYY-MM-DD` (the spend document's ID). */
export function spendDay(nowMs: number): string {
  return new Date(nowMs).toISOString().slice(0, 10);
}

/** When the day of `nowMs` ends and a new day's spend starts at zero (UTC midnight). */
export function nextSpendResetMs(nowMs: number): number {
  return (Math.floor(nowMs / DAY_MS) + 1) * DAY_MS;
}

/** Whether a user who spent `spentUsd` today may start another model call: only while under the cap. */
export function spendAllowsCall(spentUsd: number, capUsd: number): boolean {
  return spentUsd < capUsd;
}

const usd = (amount: number): string => `$${amount.toFixed(2)}`;

/** The sentence a person reads when the day's spend reached the cap (at submit, or for a running job). */
export function spendLimitMessage(spentUsd: number, capUsd: number, nowMs: number): string {
  const reset = new Date(nextSpendResetMs(nowMs)).toISOString().replace(/:00\.000Z$/, ' UTC').replace('T', ' ');
  if (capUsd === 0) return 'This account may not spend on model calls at the moment (its daily spend limit is $0); ask an operator to raise it.';
  return `Today's model spend of ${usd(spentUsd)} reached this account's daily limit of ${usd(capUsd)}; it resets at ${reset}.`;
}

export interface QuotaRefusal {
  readonly limit: QuotaLimit;
  /** The limit that was reached. */
  readonly allowed: number;
  readonly retryAfterSeconds: number;
  /** A sentence for the person: which limit, and when to try again. */
  readonly message: string;
}

export type Admission = { readonly admitted: true; readonly usage: QuotaUsage } | { readonly admitted: false; readonly refusal: QuotaRefusal };

const plural = (count: number, one: string, many: string): string => `${count} ${count === 1 ? one : many}`;

/**
 * Whether the user may submit `jobId` now. `endedJobIds` are the listed jobs found ended (or
 * gone); they are dropped from the record. An admission returns the record to write with the job.
 */
export function decideAdmission(usage: QuotaUsage, endedJobIds: ReadonlySet<string>, limits: UserLimits, jobId: string, nowMs: number, spentTodayUsd = 0): Admission {
  const inFlight = usage.inFlightJobIds.filter((id) => !endedJobIds.has(id));
  const windowStartMs = nowMs - SUBMIT_WINDOW_MS;
  const recent = usage.recentSubmitsAtMs.filter((atMs) => atMs > windowStartMs).sort((a, b) => a - b);

  if (inFlight.length >= limits.jobsInFlight) {
    const allowed = limits.jobsInFlight;
    const message =
      allowed === 0
        ? 'This account may not run jobs at the moment (its limit of jobs in progress is 0); ask an operator to raise it.'
        : `You have ${plural(inFlight.length, 'job', 'jobs')} in progress, the most allowed at once; try again when one finishes.`;
    return { admitted: false, refusal: { limit: 'jobs_in_flight', allowed, retryAfterSeconds: IN_FLIGHT_RETRY_AFTER_SECONDS, message } };
  }
  const oldest = recent[0];
  if (recent.length >= limits.submitsPerMinute) {
    const allowed = limits.submitsPerMinute;
    // The oldest submission leaves the window first; at least one second, as Retry-After counts whole seconds.
    const retryAfterSeconds = oldest === undefined ? IN_FLIGHT_RETRY_AFTER_SECONDS : Math.max(1, Math.ceil((oldest + SUBMIT_WINDOW_MS - nowMs) / 1000));
    const message =
      allowed === 0
        ? 'This account may not submit jobs at the moment (its limit of submissions per minute is 0); ask an operator to raise it.'
        : `You have submitted ${plural(recent.length, 'job', 'jobs')} in the last minute, the most allowed; try again in ${plural(retryAfterSeconds, 'second', 'seconds')}.`;
    return { admitted: false, refusal: { limit: 'submits_per_minute', allowed, retryAfterSeconds, message } };
  }
  if (!spendAllowsCall(spentTodayUsd, limits.spendUsdPerDay)) {
    const retryAfterSeconds = Math.max(1, Math.ceil((nextSpendResetMs(nowMs) - nowMs) / 1000));
    return { admitted: false, refusal: { limit: 'spend_per_day', allowed: limits.spendUsdPerDay, retryAfterSeconds, message: spendLimitMessage(spentTodayUsd, limits.spendUsdPerDay, nowMs) } };
  }
  return { admitted: true, usage: { ...usage, inFlightJobIds: [...inFlight, jobId], recentSubmitsAtMs: [...recent, nowMs], updatedAtMs: nowMs } };
}

// ---- The ceiling on anonymous jobs in flight, all accounts together ----------------------------

/**
 * `quotaTotals/anonymous`, written only in the commit that creates an anonymous account's job:
 * the jobs that may still hold a slot of the ceiling. Like a user's usage, slots are given back
 * lazily: a listed job that ended (or is quarantined) is dropped at a later anonymous submit that
 * finds the list full, so the engine writes nothing here when a job ends.
 */
export const anonymousTotalSchema = z.object({ inFlightJobIds: z.array(z.string()), updatedAtMs: z.number() });
export type AnonymousTotal = z.infer<typeof anonymousTotalSchema>;
export const EMPTY_ANONYMOUS_TOTAL: AnonymousTotal = { inFlightJobIds: [], updatedAtMs: 0 };

/** Whether the listed jobs must be looked at: only a full list can refuse, and only there can ended jobs make room. */
export function anonymousTotalNeedsPruning(total: AnonymousTotal, ceiling: number): boolean {
  return total.inFlightJobIds.length >= ceiling;
}

export type AnonymousAdmission = { readonly admitted: true; readonly total: AnonymousTotal } | { readonly admitted: false; readonly refusal: QuotaRefusal };

/** Whether one more anonymous job (`jobId`) fits under the ceiling, the listed jobs in `endedJobIds` no longer counting. */
export function decideAnonymousTotal(total: AnonymousTotal, endedJobIds: ReadonlySet<string>, ceiling: number, jobId: string, nowMs: number): AnonymousAdmission {
  const inFlight = total.inFlightJobIds.filter((id) => !endedJobIds.has(id));
  if (inFlight.length >= ceiling) {
    const message =
      ceiling === 0
        ? 'Guest (anonymous) accounts may not run jobs at the moment; sign in to submit one.'
        : `Guest (anonymous) accounts have ${plural(inFlight.length, 'job', 'jobs')} in progress together, the most allowed at once; sign in to submit now, or try again in ${IN_FLIGHT_RETRY_AFTER_SECONDS} seconds.`;
    return { admitted: false, refusal: { limit: 'anonymous_jobs_in_flight', allowed: ceiling, retryAfterSeconds: IN_FLIGHT_RETRY_AFTER_SECONDS, message } };
  }
  return { admitted: true, total: { inFlightJobIds: [...inFlight, jobId], updatedAtMs: nowMs } };
}
