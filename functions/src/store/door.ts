/**
 * The door to durable state: what `JobStore.apply(owner, decide)` takes and gives back.
 *
 * `owner` says who writes and so what the store checks before anything lands; `decide` gets the
 * records as the store read them (or as the holder last committed them) and returns a Change:
 * DATA, never a writer. The store composes every write of it in one commit (preconditions, claim
 * slots, commit marks, events, fan-out revocation), decides again on a lost race, and after the
 * commit enqueues the change's dispatch: the one place in the engine that dispatches.
 */
import type { DocumentData, Timestamp } from 'firebase-admin/firestore';
import type { JobClaim, UnitClaim } from '../core/claims';
import type { UnreadableJobError } from '../core/errors';
import type { JobRecord, UnitRecord } from '../core/job';
import type { Dispatch } from '../core/transitions';

export type { JobClaim, UnitClaim } from '../core/claims';

/** A timeline event a change adds (numbered by the store). */
export interface EventDraft {
  readonly kind: string;
  readonly message: string;
  readonly unit?: string;
}

/** The holder of a claim: a job's or a unit's. */
export type ClaimHolder = { readonly kind: 'job'; readonly claim: JobClaim } | ({ readonly kind: 'unit'; readonly claim: UnitClaim } & UnitHolderOptions);

/** Which unit a change is about, by its keys. */
export interface UnitKeys {
  readonly jobId: string;
  readonly phase: string;
  readonly unit: string;
}

/**
 * Who writes, and so what the store checks:
 * - `job`: the holder of a job claim. Refused (OwnershipLostError) unless the claim still holds;
 *   no read while its last commit stands.
 * - `unit`: the holder of a unit claim. Refused unless the unit, its job's fan-out and the unit's
 *   claim slot still say it holds; the unit is written in any case, so its precondition and the
 *   slot's fence the commit. `whileRacing` may renew the lease between lost races (a unit-only commit).
 * - `slot`: a holder's write that touches neither the job nor the unit record (a section, a
 *   transcript save, a unit heartbeat): one commit fenced by the claim slot alone, no read.
 * - `job-record`: anyone deciding from the job record alone (a claimer, the sweeper, an operator, an
 *   owner's action): `decide` refuses by throwing.
 * - `unit-record`: the same for a unit (a unit claimer); a change without `nextUnit` writes nothing.
 * - `swept-unit`: the sweeper deciding from a unit whose job may be gone or unreadable: with a
 *   readable job it is `unit-record`; without one `decide` gets `job: null` and its change may
 *   write the unit alone, conditioned on the unit's update time (a job gone stays gone; an
 *   unreadable one is ended next, by a commit conditioned on it).
 */
export type DoorOwner =
  | ClaimHolder
  | { readonly kind: 'slot'; readonly holder: ClaimHolder; readonly job?: EventJob }
  | { readonly kind: 'job-record'; readonly jobId: string }
  | { readonly kind: 'unit-record'; readonly keys: UnitKeys }
  | { readonly kind: 'swept-unit'; readonly keys: UnitKeys };

/** The unit owner's extra: a lease renewal to commit between lost races (null: the lease is fresh enough). */
export interface UnitHolderOptions {
  readonly whileRacing?: (unit: UnitRecord) => UnitRecord | null;
}

/** What a job's timeline event records of it; a `slot` owner writing unit events names its job so. */
export type EventJob = Pick<JobRecord, 'id' | 'epoch' | 'status' | 'phase'>;

/** A claim slot as read before a unit change (fields unchecked: a missing slot has none). */
export interface ClaimSlotView {
  readonly exists: boolean;
  readonly state: unknown;
  readonly epoch: unknown;
}

/** The records `decide` gets, by owner. */
export type CurrentOf<O extends DoorOwner> = O extends { readonly kind: 'job' | 'job-record' }
  ? JobCurrent
  : O extends { readonly kind: 'unit' | 'unit-record' }
    ? UnitCurrent
    : O extends { readonly kind: 'swept-unit' }
      ? SweptUnitCurrent
      : SlotCurrent;

export interface JobCurrent {
  readonly job: JobRecord;
}

export interface UnitCurrent {
  readonly job: JobRecord;
  readonly unit: UnitRecord;
  readonly slot: ClaimSlotView;
}

/** A unit as the sweeper reads it: `job` null when its job is gone or its document cannot be read (`unreadable` says why). */
export interface SweptUnitCurrent {
  readonly job: JobRecord | null;
  readonly unreadable: UnreadableJobError | null;
  readonly unit: UnitRecord;
}

/** Nothing is read for a slot-fenced write: the slot's precondition proves the claim. */
export type SlotCurrent = Record<string, never>;

/** A unit as read for a commit that rewrites it: its record and the update time the rewrite is conditioned on (null: absent). */
export interface StoredUnit {
  readonly record: UnitRecord;
  readonly updateTime: Timestamp;
}

/** A fan-out's unit as read before its start rewrites it (record null: there was none). */
export interface UnitVersion {
  readonly unit: string;
  readonly record: UnitRecord | null;
  readonly updateTime: Timestamp | null;
}

/**
 * A document a change was decided from, as read: a write conditioned on it fails the commit when the
 * document changed since (the change is then decided again from a new read). No lock is taken.
 */
export interface ReadVersion {
  readonly path: string;
  readonly updateTime: Timestamp;
}

/** A document a change carries besides the job and unit records. */
export type DocumentWrite =
  /** A phase checkpoint (replaces any earlier one: the commit is fenced by the job). */
  | { readonly kind: 'checkpoint'; readonly phase: string; readonly document: DocumentData }
  /** The published answer, created at the job's outbox: one there already fails the commit, which is decided again. */
  | { readonly kind: 'outbox'; readonly document: DocumentData }
  /** A finished section, created: first write wins (ALREADY_EXISTS comes back to the caller of a slot write). */
  | { readonly kind: 'section'; readonly phase: string; readonly unit: string | null; readonly id: string; readonly document: DocumentData }
  /** One save of a section's transcript log. */
  | { readonly kind: 'transcript-save'; readonly phase: string; readonly unit: string | null; readonly id: string; readonly save: number; readonly document: DocumentData }
  /** The fields a unit holder's heartbeat rewrites (lease, progress, cost, tally), unconditioned: the slot fences it. */
  | { readonly kind: 'unit-flush'; readonly unit: UnitRecord }
  /** Another unit of the fan-out rewritten, conditioned on the update time it was read at. */
  | { readonly kind: 'unit'; readonly read: StoredUnit; readonly next: UnitRecord }
  /** The unit records a fan-out starts with, each created or replaced under the version read. */
  | { readonly kind: 'fan-out-units'; readonly units: readonly { readonly record: UnitRecord; readonly updateTime: Timestamp | null }[] }
  /** A document of the job created whole (an effect entry): one there already fails the commit, which is decided again from a new read. */
  | { readonly kind: 'create'; readonly path: string; readonly document: DocumentData }
  /** Any other document of the job, written whole (an audit copy); fenced by the commit's other preconditions. */
  | { readonly kind: 'put'; readonly path: string; readonly document: DocumentData }
  /** Fields of a document the change was decided from (an effect entry), updated under the update time it was read at. */
  | { readonly kind: 'update-read'; readonly read: ReadVersion; readonly fields: DocumentData }
  /** A document the change was decided from, deleted under the update time it was read at. */
  | { readonly kind: 'delete-read'; readonly read: ReadVersion }
  /**
   * A document the change was decided from and leaves as it is: `field` is written back with the
   * `value` it was read with, under the update time it was read at. A write that changes nothing
   * keeps the document's update time, so it fences this commit without disturbing anyone else's.
   */
  | { readonly kind: 'unchanged'; readonly read: ReadVersion; readonly field: string; readonly value: unknown };

/** What `decide` returns: the next records, their events, the documents they carry, the tasks to enqueue once committed, and the caller's value. */
export interface Change<T> {
  readonly next?: JobRecord;
  readonly nextUnit?: UnitRecord;
  readonly events?: readonly EventDraft[];
  readonly documents?: readonly DocumentWrite[];
  readonly dispatch?: Dispatch | readonly (Dispatch | undefined)[] | undefined;
  readonly value: T;
}

export type Decide<O extends DoorOwner, T> = (current: CurrentOf<O>) => Change<T> | Promise<Change<T>>;

/** The dispatches of a change as a list. */
export function dispatchesOf(change: Pick<Change<unknown>, 'dispatch'>): Dispatch[] {
  const { dispatch } = change;
  if (dispatch === undefined) return [];
  if (Array.isArray(dispatch)) return (dispatch as readonly (Dispatch | undefined)[]).filter((entry): entry is Dispatch => entry !== undefined);
  return [dispatch as Dispatch];
}
