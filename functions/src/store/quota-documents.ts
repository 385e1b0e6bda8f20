/**
 * The Firestore side of the limits per user (`core/quota.ts` decides): `quotaUsage/{uid}`, read
 * and written in the transaction that creates the user's job, and `userLimits/{uid}`, the
 * operator's override. Both documents are written by the functions and the operator's tools only;
 * the security rules let a user read their own.
 *
 * Concurrent submits of one user contend on their usage document, so the transactions run one
 * after another and a limit of 3 accepts exactly 3 of 10 parallel submits. Submits of different
 * users never contend, except anonymous ones: they also share `quotaTotals/anonymous`, the ceiling
 * on all anonymous accounts' jobs in flight, written by the same commit under the same kind of
 * precondition (so it takes one write per admitted anonymous job).
 */
import { FieldValue, Timestamp, type DocumentData, type DocumentReference, type DocumentSnapshot, type Firestore } from 'firebase-admin/firestore';
import { z } from 'zod';
import { PhaselineError } from '../core/errors';
import type { JobStatus } from '../core/job';
import {
  anonymousTotalNeedsPruning,
  anonymousTotalSchema,
  DEFAULT_QUOTA_DEFAULTS,
  decideAdmission,
  decideAnonymousTotal,
  EMPTY_ANONYMOUS_TOTAL,
  type AnonymousTotal,
  type Admission,
  EMPTY_QUOTA_USAGE,
  SLOT_FREE_STATUSES,
  limitsFor,
  nextSpendResetMs,
  quotaUsageSchema,
  spendDay,
  userLimitsOverrideSchema,
  type QuotaDefaults,
  type QuotaRefusal,
  type QuotaUsage,
  type UserLimits,
  type UserLimitsOverride,
} from '../core/quota';
import { isAlreadyExists, type FirestoreHandle, type JobWriter } from './firestore-handle';
import { ANONYMOUS_TOTAL_PATH, jobPath, quotaUsagePath, spendChargePath, spendDayPath, userLimitsPath } from './paths';
import { EXPIRE_AT } from './retention';

/** Who is submitting, as the ID token says. */
export interface Submitter {
  readonly uid: string;
  readonly anonymous: boolean;
}

/**
 * Runs inside the transaction that creates a job, after the job is known to be new: reads what it
 * needs, then refuses (the transaction writes nothing) or records the job and returns null.
 */
/**
 * Whether one more job of a submitter is admitted, decided from `reads` as read in the same
 * `getAll` as the job itself (one read time: a repeat whose job just landed is seen as a repeat,
 * never refused). An admitted job comes with `admit`, which adds the usage write to the job's
 * creating commit, conditioned on the usage document as it was read (created if it was absent): a
 * submit or an operator's change of the user's limits that raced it fails that commit, which is
 * decided again from fresh reads.
 */
export interface JobAdmission {
  reads(nowMs: number): readonly DocumentReference[];
  decide(snapshots: readonly DocumentSnapshot[], jobId: string, nowMs: number): Promise<{ readonly refused: QuotaRefusal } | { readonly admit: (writer: JobWriter) => void }>;
}

function corrupt(path: string, error: unknown): PhaselineError {
  return new PhaselineError('internal', false, `${path} is malformed: ${error instanceof Error ? error.message : String(error)}`, { cause: error });
}

function decodeOverride(snapshot: DocumentSnapshot): UserLimitsOverride | null {
  if (!snapshot.exists) return null;
  const parsed = userLimitsOverrideSchema.safeParse(snapshot.data());
  if (!parsed.success) throw corrupt(snapshot.ref.path, parsed.error);
  return parsed.data;
}

/**
 * `quotaUsage/{uid}/spendDays/{day}`: what the user's model calls of that UTC day cost. Below zero
 * is allowed: an operator's credit (a negative increment) that overshoots is still a readable day.
 */
const spendDaySchema = z.looseObject({
  // Absent on a day that only has the override's copy so far.
  usd: z.number().optional(),
  calls: z.number().int().min(0).optional(),
  /** The operator's override as `setUserLimits` last wrote it (null: none), so a check needs no read of `userLimits`. */
  limits: userLimitsOverrideSchema.nullable().optional(),
});

/** Today's and tomorrow's days get the override's copy: a step that read the old one before midnight finds the new one after it. */
const DAYS_GIVEN_THE_OVERRIDE = 2;
const DAY_MS = 86_400_000;

/** A user's spend or limits document is malformed: their calls wait for an operator to repair it. */
export class UnreadableSpendRecordError extends PhaselineError {
  constructor(message: string, options: { readonly cause?: unknown } = {}) {
    super('internal', false, message, options);
  }
}

/** A spend day kept this long after it ends (the TTL policy on `expireAt`): enough for a month's accounting. */
const SPEND_DAY_RETENTION_MS = 35 * 86_400_000;

function decodeSpendDay(snapshot: DocumentSnapshot | undefined): z.infer<typeof spendDaySchema> {
  if (!snapshot?.exists) return { usd: 0 };
  const parsed = spendDaySchema.safeParse(snapshot.data());
  if (!parsed.success) throw corrupt(snapshot.ref.path, parsed.error);
  return parsed.data;
}

function decodeSpent(snapshot: DocumentSnapshot | undefined): number {
  return decodeSpendDay(snapshot).usd ?? 0;
}

/** The day's copy of the override as a comparable key: 'absent' when the day has none. */
function copyKey(limits: UserLimitsOverride | null | undefined): string {
  return limits === undefined ? 'absent' : JSON.stringify(limits);
}

function spendDayExpiry(dayMs: number): Timestamp {
  return Timestamp.fromMillis(nextSpendResetMs(dayMs) + SPEND_DAY_RETENTION_MS);
}

function decodeAnonymousTotal(snapshot: DocumentSnapshot): AnonymousTotal {
  if (!snapshot.exists) return EMPTY_ANONYMOUS_TOTAL;
  const parsed = anonymousTotalSchema.safeParse(snapshot.data());
  if (!parsed.success) throw corrupt(snapshot.ref.path, parsed.error);
  return parsed.data;
}

/** A write of the commit that admits a job, conditioned on the document as it was read (created if it was absent). */
function conditionedWrite(writer: JobWriter, ref: DocumentReference, snapshot: DocumentSnapshot, data: DocumentData): void {
  const updateTime = snapshot.exists ? snapshot.updateTime : undefined;
  if (updateTime) writer.update(ref, data, { lastUpdateTime: updateTime });
  else writer.create(ref, data);
}

function decodeUsage(snapshot: DocumentSnapshot): QuotaUsage {
  if (!snapshot.exists) return EMPTY_QUOTA_USAGE;
  const parsed = quotaUsageSchema.safeParse(snapshot.data());
  if (!parsed.success) throw corrupt(snapshot.ref.path, parsed.error);
  return parsed.data;
}

export class SubmitQuota {
  constructor(
    private readonly db: Firestore,
    private readonly defaults: QuotaDefaults,
  ) {}

  /**
   * The admission check of one submitter's job, for JobStore.createJob: its usage, its override and
   * today's spend, no lock. Today's spend only grows within a day and the steps charging it must not
   * wait on a submit, so it only informs the decision; the usage document, which every admission
   * and every change of the user's limits (setUserLimits) rewrites, fences it.
   */
  admission(submitter: Submitter): JobAdmission {
    const usageRef = this.db.doc(quotaUsagePath(submitter.uid));
    const limitsRef = this.db.doc(userLimitsPath(submitter.uid));
    // An anonymous account's job also takes a slot under the ceiling of all anonymous accounts together.
    const ceiling = submitter.anonymous ? this.defaults.anonymousJobsInFlightTotal : undefined;
    const totalRef = ceiling === undefined ? null : this.db.doc(ANONYMOUS_TOTAL_PATH);
    return {
      reads: (nowMs) => [usageRef, limitsRef, this.db.doc(spendDayPath(submitter.uid, spendDay(nowMs))), ...(totalRef ? [totalRef] : [])],
      decide: async ([usage, override, spent, totalSnapshot], jobId, nowMs) => {
        const admission = await this.decide(usage, override, new Set(), submitter, jobId, nowMs, decodeSpent(spent));
        if (!admission.admitted) return { refused: admission.refusal };
        if (!usage) throw new Error('getAll returned fewer snapshots than references');
        let total: { readonly snapshot: DocumentSnapshot; readonly next: AnonymousTotal } | null = null;
        if (totalRef && ceiling !== undefined) {
          if (!totalSnapshot) throw new Error('getAll returned fewer snapshots than references');
          const current = decodeAnonymousTotal(totalSnapshot);
          const ended = anonymousTotalNeedsPruning(current, ceiling) ? await this.endedJobs(current.inFlightJobIds) : new Set<string>();
          const decided = decideAnonymousTotal(current, ended, ceiling, jobId, nowMs);
          if (!decided.admitted) return { refused: decided.refusal };
          total = { snapshot: totalSnapshot, next: decided.total };
        }
        const next = { ...admission.usage, anonymous: submitter.anonymous };
        return {
          // Both conditioned: racing submits of this user, or of any anonymous account, decide again from fresh reads.
          admit: (writer) => {
            conditionedWrite(writer, usageRef, usage, next);
            if (totalRef && total) conditionedWrite(writer, totalRef, total.snapshot, total.next);
          },
        };
      },
    };
  }

  /** Decides from the two documents; `ended` collects the listed jobs found ended, so a second decision reads only the others. */
  private async decide(
    usageSnapshot: DocumentSnapshot | undefined,
    overrideSnapshot: DocumentSnapshot | undefined,
    ended: Set<string>,
    submitter: Submitter,
    jobId: string,
    nowMs: number,
    spentTodayUsd: number,
  ): Promise<Admission> {
    if (!usageSnapshot || !overrideSnapshot) throw new Error('getAll returned fewer snapshots than references');
    const usage = decodeUsage(usageSnapshot);
    const limits = limitsFor(this.defaults, submitter.anonymous, decodeOverride(overrideSnapshot));
    for (const id of await this.endedJobs(usage.inFlightJobIds.filter((listed) => !ended.has(listed)))) ended.add(id);
    return decideAdmission(usage, ended, limits, jobId, nowMs, spentTodayUsd);
  }

  /**
   * The listed jobs that ended or are gone. A plain read, not the transaction's: an ended status is
   * final, so a stale read can only count a job as still in flight (never free a slot early), and
   * transactional reads would lock the user's running jobs against their own workers' commits.
   */
  private async endedJobs(jobIds: readonly string[]): Promise<ReadonlySet<string>> {
    if (jobIds.length === 0) return new Set();
    const snapshots = await this.db.getAll(...jobIds.map((id) => this.db.doc(jobPath(id))));
    const ended = new Set<string>();
    for (const snapshot of snapshots) {
      // The status alone decides: a document the codec refuses elsewhere (store/unreadable-jobs.ts) must not fail its owner's submits.
      const status: unknown = snapshot.get('status');
      if (!snapshot.exists || (typeof status === 'string' && SLOT_FREE_STATUSES.has(status as JobStatus))) ended.add(snapshot.id);
    }
    return ended;
  }
}

/** What an operator sees and sets: the override as stored (null: none) and the limits in force for each kind of account. */
export interface UserLimitsView {
  readonly override: UserLimitsOverride | null;
  readonly signedIn: UserLimits;
  readonly anonymous: UserLimits;
}

export async function readUserLimits(db: Firestore, defaults: QuotaDefaults, uid: string): Promise<UserLimitsView> {
  const override = decodeOverride(await db.doc(userLimitsPath(uid)).get());
  return { override, signedIn: limitsFor(defaults, false, override), anonymous: limitsFor(defaults, true, override) };
}

/**
 * Sets (a number) or clears (null) each named limit of the user's override; limits not named keep
 * their value. Validated before it is written, so a submit never meets a malformed override. The
 * same commit copies the override into today's and tomorrow's spend days, which the steps read
 * before every model call: a cut applies from the next call without a read of `userLimits` per call.
 */
export async function setUserLimits(
  db: Firestore,
  uid: string,
  change: { readonly [K in keyof UserLimits]?: number | null },
  nowMs: number,
): Promise<UserLimitsOverride | null> {
  const ref = db.doc(userLimitsPath(uid));
  const usageRef = db.doc(quotaUsagePath(uid));
  return db.runTransaction(async (tx) => {
    const [limitsSnapshot, usage] = await tx.getAll(ref, usageRef);
    if (!limitsSnapshot || !usage) throw new Error('getAll returned fewer snapshots than references');
    const current = decodeOverride(limitsSnapshot) ?? {};
    // A null in the change clears that limit; the update time is written afresh.
    const merged: Record<string, unknown> = { ...current, ...change };
    const next = Object.fromEntries(Object.entries(merged).filter(([name, value]) => name !== 'updatedAtMs' && value !== null));
    let override: UserLimitsOverride | null = null;
    if (Object.keys(next).length > 0) {
      const parsed = userLimitsOverrideSchema.safeParse({ ...next, updatedAtMs: nowMs });
      if (!parsed.success) throw new PhaselineError('invalid_input', false, `Invalid limits for ${uid}: ${parsed.error.issues.map((issue) => `${issue.path.join('.')} ${issue.message}`).join('; ')}`);
      override = parsed.data;
    }
    if (override === null) tx.delete(ref);
    else tx.set(ref, override);
    // A submit admits under the limits it read and conditions its commit on the usage document: touching it here makes a
    // submit that read the old limits decide again (an absent usage is written empty, so the submit's create of it fails).
    if (usage.exists) tx.update(usageRef, { limitsChangedAtMs: nowMs });
    else tx.create(usageRef, { ...EMPTY_QUOTA_USAGE, updatedAtMs: nowMs, limitsChangedAtMs: nowMs });
    for (let day = 0; day < DAYS_GIVEN_THE_OVERRIDE; day += 1) {
      const dayMs = nowMs + day * DAY_MS;
      // mergeFields: the copy replaces the one before as a whole (a plain merge would keep a cleared limit's old value); the spend is left alone.
      tx.set(db.doc(spendDayPath(uid, spendDay(dayMs))), { limits: override, [EXPIRE_AT]: spendDayExpiry(dayMs) }, { mergeFields: ['limits', EXPIRE_AT] });
    }
    return override;
  });
}

/** What a step reads of its owner once, at its first check: the kind of account (it picks the default cap) and the operator's override. */
export interface SpendFacts {
  readonly anonymous: boolean;
  readonly override: UserLimitsOverride | null;
  /** The day's copy of the override as that first check saw it (copyKey): a copy that differs later was written during the step. */
  readonly copySeen: string;
}

/** The day's spend and the cap in force. */
export interface SpendToday {
  readonly spentUsd: number;
  readonly capUsd: number;
}

/** A later check's read: the day, and which of the charges it was asked about have landed (their spend is in `spentUsd`). */
export interface SpendTodayAndLanded extends SpendToday {
  readonly landed: ReadonlySet<string>;
}

/** One write of a step's charges. */
export interface SpendCharge {
  /**
   * Its identity, a document ID unique to this write (the charging step's claim and the write's
   * sequence number): written again under the same ID, after an answer that was lost, it counts once.
   */
  readonly id: string;
  readonly usd: number;
  readonly calls: number;
}

/** A charge written before whose outcome is unknown: its ID and when it was charged (the day it counts against). */
export interface UnsettledCharge {
  readonly id: string;
  readonly atMs: number;
}

/**
 * The spend side for the steps: which cap applies to a job's owner, what they spent today, and
 * charging a call's cost. A charge is a blind increment of the day (no read, no transaction), so
 * charges from every worker of one user add up without contending, committed with the create of a
 * record named by the charge's ID: a repeat of a charge that landed fails that create
 * (ALREADY_EXISTS) and adds nothing. The check before a call is one plain read.
 */
export class SpendLedger {
  constructor(
    private readonly db: Firestore,
    private readonly defaults: QuotaDefaults,
  ) {}

  /**
   * A step's first check, in one round trip: whether the owner's account was anonymous at their
   * last submit (absent, or a record from before the cap: signed-in), the operator's override in
   * `userLimits`, and today's spend with its copy of the override. A malformed document is an
   * UnreadableSpendRecordError: nothing is spent against a record nobody can read.
   */
  async firstCheck(uid: string, nowMs: number): Promise<{ readonly facts: SpendFacts; readonly today: SpendToday }> {
    const [usage, override, spent] = await this.db.getAll(this.db.doc(quotaUsagePath(uid)), this.db.doc(userLimitsPath(uid)), this.db.doc(spendDayPath(uid, spendDay(nowMs))));
    if (!usage || !override || !spent) throw new Error('getAll returned fewer snapshots than references');
    return readable(() => {
      const day = decodeSpendDay(spent);
      const facts: SpendFacts = { anonymous: decodeUsage(usage).anonymous === true, override: decodeOverride(override), copySeen: copyKey(day.limits) };
      return { facts, today: this.todayFrom(day, facts) };
    });
  }

  /**
   * A later check: one read of today's spend day. The cap follows `userLimits` as the step's first
   * check read it, unless the day's copy of the override changed since (`setUserLimits` ran during
   * the step: an operator's cut applies from the next check read); a `userLimits` document edited by other
   * means, with no new copy, applies from the next step.
   */
  async today(uid: string, facts: SpendFacts, nowMs: number, unsettled: readonly UnsettledCharge[] = []): Promise<SpendTodayAndLanded> {
    const dayRef = this.db.doc(spendDayPath(uid, spendDay(nowMs)));
    if (unsettled.length === 0) {
      const spent = await dayRef.get();
      return { ...readable(() => this.todayFrom(decodeSpendDay(spent), facts)), landed: new Set() };
    }
    // One read time for the day and the records: a charge found landed is in the day's spend as read.
    const [spent, ...records] = await this.db.getAll(dayRef, ...unsettled.map((charge) => this.db.doc(spendChargePath(uid, spendDay(charge.atMs), charge.id))));
    const landed = new Set(records.filter((record) => record.exists).map((record) => record.id));
    return { ...readable(() => this.todayFrom(decodeSpendDay(spent), facts)), landed };
  }

  private todayFrom(day: z.infer<typeof spendDaySchema>, facts: SpendFacts): SpendToday {
    const copied = copyKey(day.limits) !== facts.copySeen && day.limits !== undefined;
    const override = copied ? (day.limits ?? null) : facts.override;
    return { spentUsd: day.usd ?? 0, capUsd: limitsFor(this.defaults, facts.anonymous, override).spendUsdPerDay };
  }

  /**
   * Adds the cost of some calls to the owner's day of `nowMs`, once per charge ID: a charge that
   * already landed (its answer was lost, and it is written again) adds nothing and resolves.
   */
  async charge(uid: string, charge: SpendCharge, nowMs: number): Promise<void> {
    const day = spendDay(nowMs);
    const expireAt = spendDayExpiry(nowMs);
    const batch = this.db.batch();
    batch.create(this.db.doc(spendChargePath(uid, day, charge.id)), { usd: charge.usd, calls: charge.calls, chargedAt: Timestamp.fromMillis(nowMs), [EXPIRE_AT]: expireAt });
    batch.set(
      this.db.doc(spendDayPath(uid, day)),
      { usd: FieldValue.increment(charge.usd), calls: FieldValue.increment(charge.calls), updatedAt: Timestamp.fromMillis(nowMs), [EXPIRE_AT]: expireAt },
      { merge: true },
    );
    try {
      await batch.commit();
    } catch (error) {
      // The record is there: this charge landed before (nothing of this commit did).
      if (!isAlreadyExists(error)) throw error;
    }
  }
}

/** Runs a decode; a malformed document comes out as an UnreadableSpendRecordError. */
function readable<T>(decode: () => T): T {
  try {
    return decode();
  } catch (error) {
    throw new UnreadableSpendRecordError(error instanceof Error ? error.message : String(error), { cause: error });
  }
}

/** The ledger a runner uses when none was given: the store's Firestore, the default caps. */
export function defaultSpendLedger(store: FirestoreHandle): SpendLedger {
  return new SpendLedger(store.db, DEFAULT_QUOTA_DEFAULTS);
}
