/**
 * Every durable state change of a job. Each is one commit whose job write is conditioned on the
 * update time the decision was made from: a claim reads the job and commits; a holder commits on
 * the update time of its own last commit, without reading, and reads only when that precondition
 * fails (someone else wrote the job: a decision, a cancel, the sweeper). Changes that must read
 * other documents to decide (effects, the outbox, units) run in a Firestore transaction instead.
 */
import { createHash, randomUUID } from 'node:crypto';
import { FieldValue, Timestamp, type DocumentData, type DocumentReference, type DocumentSnapshot, type Firestore, type Precondition, type SetOptions, type Transaction, type UpdateData, type WriteBatch } from 'firebase-admin/firestore';
import type { Clock } from '../core/clock';
import type { EngineOptions } from '../core/options';
import { heldJobEpoch, heldUnitEpoch, jobClaimRefusal, unitClaimRefusal, type JobClaim, type UnitClaim } from '../core/claims';
import { CheckpointWriteError, describeError, OwnershipLostError, PhaselineError, UnreadableJobError } from '../core/errors';
import { ENDED_STATUSES, newQueuedJob, type FanOutState, type JobRecord } from '../core/job';
import { endedAtMs, expireAtMs, withRetentionDue } from '../core/lifecycle';
import type { QuotaRefusal } from '../core/quota';
import type { Dispatch } from '../core/transitions';
import { decodeJob, decodeUnit, encodeJob, encodeUnit, encodeUnitFlush, type UnitRecord } from './codec';
import { readFanOutUnits } from './checkpoint-reads';
import { ClaimSession, type ClaimSlotRecord } from './claim-session';
import { FirestoreHandle, isAlreadyExists, isFailedPrecondition, isTransientFirestoreError, type JobVersion, type JobWriter } from './firestore-handle';
import { dispatchesOf, type Change, type ClaimHolder, type ClaimSlotView, type CurrentOf, type Decide, type DocumentWrite, type DoorOwner, type EventDraft, type EventJob, type StoredUnit, type SweptUnitCurrent, type UnitCurrent, type UnitKeys, type UnitVersion } from './door';
import { outboxRef, sectionRef, transcriptSaveRef } from './job-documents';
import type { TaskQueuePort } from './task-queue';
import type { JobAdmission } from './quota-documents';
import { claimPath, conversationPath, eventId, eventPath, JOB_CLAIM_SLOT, JOBS, unitClaimSlot, unitsPath } from './paths';
import type { JobCommit, UnitCommit } from './record-commits';
import { noteCommitPreconditionFailed, noteJobCommit, noteUnitCommit } from '../telemetry/commits';

export { isAlreadyExists, isTransientFirestoreError } from './firestore-handle';
export type { EventDraft, UnitVersion } from './door';

export interface NewJob {
  readonly owner: string;
  readonly pipeline: string;
  readonly input: unknown;
  readonly conversationId: string | null;
  readonly idempotencyKey: string | null;
  /** The version of the pipeline the input was validated against (submit's validator says); not part of the request's identity. */
  readonly pipelineVersion?: number;
}

export type CreateJobResult =
  | { readonly created: boolean; readonly job: JobRecord }
  /** The same owner reused an Idempotency-Key for a different request. */
  | { readonly conflict: true; readonly job: JobRecord }
  /** The admission check refused a new job (a limit of its owner); nothing was written. */
  | { readonly refused: QuotaRefusal };

/** The job ID an idempotency key maps to: the same owner and key always name the same job. */
export function jobIdForIdempotencyKey(owner: string, key: string): string {
  return `k${createHash('sha256').update(`${owner}\n${key}`).digest('hex').slice(0, 27)}`;
}

function requestFingerprint(job: NewJob): string {
  return createHash('sha256').update(JSON.stringify([job.pipeline, job.input, job.conversationId])).digest('hex');
}


/** A unit change as `commitUnitChange` commits it. */
export interface UnitChange<T> {
  readonly next?: JobRecord;
  readonly nextUnit?: UnitRecord;
  readonly events?: readonly EventDraft[];
  readonly value: T;
}

/** A claim slot's update time as read before a commit (null: it did not exist), to condition the commit on. */
export interface SlotFence {
  readonly updateTime: Timestamp | null;
}

/** A unit document as a commit that rewrites it is conditioned on it (a snapshot, or what one said). */
export interface UnitSnapshot {
  readonly ref: DocumentReference;
  readonly updateTime?: Timestamp | undefined;
}

/** A job change that decides from the job record alone: its writes go out in one conditioned commit. */
export interface JobTransaction {
  readonly tx: JobWriter;
  readonly job: JobRecord;
}

/** A job change that must read other documents to decide: a Firestore transaction. */
export interface ReadingJobTransaction {
  readonly tx: Transaction;
  readonly job: JobRecord;
  readonly snapshot: DocumentSnapshot;
}

type JobChange<T> = { next?: JobRecord; events?: readonly EventDraft[]; value: T };

/** The job as just read: its record, the update time a commit is conditioned on, and the mark of the commit that wrote it last. */
interface FreshVersion {
  readonly fresh: true;
  readonly record: JobRecord;
  readonly updateTime: Timestamp | undefined;
  readonly mark: unknown;
}

/** What a claim holder last committed to its job, and that commit's update time: its next commit is conditioned on it. */
interface OwnerView {
  readonly epoch: number;
  readonly record: JobRecord;
  readonly updateTime: Timestamp;
  /** The update time of the job's claim slot as the claiming commit wrote it (every write of one commit shares its time). */
  readonly slotUpdateTime: Timestamp | null;
}

/** Conditioned commits that find the job changed, in a row, before one gives up. Each costs one read. */
const MAX_JOB_COMMIT_ATTEMPTS = 8;
/** Each round of a burst of one user's submits admits or refuses at least one of them: 30 at once all get an answer. */
const MAX_SUBMIT_COMMIT_ATTEMPTS = 32;
/** Pause before a unit change reads again after losing a race: up to this many ms per attempt so far, at most the cap. */
const UNIT_RACE_PAUSE_STEP_MS = 5;
const UNIT_RACE_PAUSE_CAP_MS = 100;
/** Owner views kept per process (one per job a worker here holds); the oldest go first past it. */
const MAX_OWNER_VIEWS = 1_000;

/**
 * Each engine commit marks the job or unit record it writes with a token of its own (never read
 * into the record): a commit whose answer was lost is found to have landed by its mark alone, so
 * the writer goes on from it (a claim stays this step's, a hand-off still dispatches) instead of
 * deciding again from a record it wrote itself.
 */
export const COMMIT_MARK_FIELD = 'commitMark';

/**
 * A commit that may have landed while its answer was lost: the next try reads its record first and,
 * if the mark is there, goes on from it. Not only a transient failure leaves one: the Firestore SDK
 * retries a Commit that failed UNAVAILABLE by itself (its gapic config), and when the first one had
 * landed, the same writes sent again fail their own precondition (or `create`): a FAILED_PRECONDITION
 * or ALREADY_EXISTS may be this commit's own too, and only the mark tells.
 */
interface UnconfirmedCommit<T> {
  readonly mark: string;
  readonly value: T;
  readonly writer: object;
}

/** A commit that failed so may have landed all the same (see UnconfirmedCommit): only its mark tells. */
function mayHaveLanded(error: unknown): boolean {
  return isTransientFirestoreError(error) || isFailedPrecondition(error) || isAlreadyExists(error);
}

/** How a unit's conditioned commit behaves while it keeps losing races. */
export interface UnitCommitOptions {
  /**
   * Runs after a lost race, before the next attempt decides, with the unit as the lost attempt read
   * it (e.g. to renew its lease); resolves to whether it wrote (the next attempt then reads again).
   * Not run when the lost race was this commit's own (it had landed, its answer lost).
   */
  readonly beforeRetry?: (unit: UnitRecord) => Promise<boolean>;
}

/** The records any owner's `decide` may get (CurrentOf narrows it per owner). */
type AnyCurrent = CurrentOf<DoorOwner>;

export type StoreLog = (message: string, detail?: Record<string, unknown>) => void;

/**
 * What one process remembers of its own commits, so a holder's next commit needs no read: the
 * job as each holder last committed it (owner views), and one owner-write session per claim slot,
 * started from the slot's update time when this process wrote it last.
 */
class StoreMemory {
  readonly ownerViews = new Map<string, OwnerView>();
  private readonly sessions = new Map<string, ClaimSession>();
  private readonly slotWrites = new Map<string, { readonly epoch: number; readonly updateTime: Timestamp }>();

  session(slotPath: string, epoch: number, make: (slotUpdateTime: Timestamp | null) => ClaimSession): ClaimSession {
    const existing = this.sessions.get(slotPath);
    if (existing?.epoch === epoch) return existing;
    const written = this.slotWrites.get(slotPath);
    this.slotWrites.delete(slotPath);
    const session = make(written?.epoch === epoch ? written.updateTime : null);
    remember(this.sessions, slotPath, session);
    return session;
  }

  slotWritten(slotPath: string, epoch: number, updateTime: Timestamp): void {
    const session = this.sessions.get(slotPath);
    if (session?.epoch === epoch) session.slotWrittenAt(updateTime);
    else remember(this.slotWrites, slotPath, { epoch, updateTime });
  }
}

/** Sets `key` as the newest entry of a bounded map: the oldest go first past MAX_OWNER_VIEWS. */
function remember<V>(map: Map<string, V>, key: string, value: V): void {
  map.delete(key);
  map.set(key, value);
  if (map.size > MAX_OWNER_VIEWS) map.delete(map.keys().next().value as string);
}

/** The commit span's name for a slot-fenced write, by what it carries. */
function slotWriteLabel(documents: readonly DocumentWrite[]): string {
  const first = documents[0];
  if (first?.kind === 'section') return `section ${first.id}`;
  if (first?.kind === 'transcript-save') return `transcript ${first.id}`;
  return 'heartbeat';
}

export class JobStore extends FirestoreHandle implements JobCommit, UnitCommit {
  /** Fan-outs a commit ends, per commit attempt (a batch or a transaction): their running units lose their claims after it commits. */
  private readonly endedFanOuts = new WeakMap<object, { jobId: string; fanout: FanOutState }[]>();
  /** The mark of each commit attempt (a batch or a transaction), written on the records it commits (COMMIT_MARK_FIELD). */
  private readonly commitMarks = new WeakMap<object, string>();

  constructor(
    db: Firestore,
    clock: Clock,
    options: EngineOptions,
    /** Where `apply` enqueues a committed change's tasks; a store without one refuses a change that carries any. */
    readonly queue: TaskQueuePort | null = null,
    /** Told when an enqueue after a commit fails (the sweeper re-dispatches a queued job whose task went missing). */
    readonly log?: StoreLog,
  ) {
    super(db, clock, options);
  }

  /** What this process remembers of its own commits; shared with every store made from this one (dispatchingTo). */
  private readonly memory = new StoreMemory();

  /**
   * This very store (everything it is and remembers, read through to it) enqueueing committed tasks
   * to `queue` and logging to `log`: itself when it does already.
   */
  dispatchingTo(queue: TaskQueuePort, log: StoreLog | undefined = this.log): JobStore {
    if (queue === this.queue && log === this.log) return this;
    const bound = Object.create(this) as JobStore;
    Object.defineProperties(bound, { queue: { value: queue }, log: { value: log } });
    return bound;
  }

  /**
   * The door: every durable change of a job or unit goes through here. `owner` says who writes and
   * what is checked (see DoorOwner); `decide` gets the records as read and returns the change as
   * data. The store composes the commit, decides again on a lost race (so `decide` must be free of
   * side effects; it may read other documents), and once it has committed enqueues the change's
   * dispatch. Resolves to the change's value; a refusal is an OwnershipLostError.
   */
  async apply<O extends DoorOwner, T>(owner: O, decide: Decide<O, T>): Promise<T> {
    const change = await this.commitChange(owner, decide as (current: AnyCurrent) => Change<T> | Promise<Change<T>>);
    await this.enqueue(dispatchesOf(change));
    return change.value;
  }

  private commitChange<T>(owner: DoorOwner, decide: (current: AnyCurrent) => Change<T> | Promise<Change<T>>): Promise<Change<T>> {
    switch (owner.kind) {
      case 'job':
        return this.transact(owner.claim.jobId, (job) => jobClaimRefusal(job, owner.claim), ({ tx, job }) => this.decided(tx, job, decide({ job })), owner.claim);
      case 'job-record':
        return this.transact(owner.jobId, () => null, ({ tx, job }) => this.decided(tx, job, decide({ job })));
      case 'unit':
        return this.commitHeldUnit(owner, decide);
      case 'unit-record':
        return this.commitUnitRecord(owner.keys, decide);
      case 'slot':
        return this.commitFencedBySlot(owner.holder, owner.job, decide);
      case 'swept-unit':
        return this.commitSweptUnit(owner.keys, decide);
    }
  }

  /**
   * The sweeper's unit (see DoorOwner `swept-unit`): the unit-record commit while its job reads; when
   * the job is gone or unreadable, `decide` gets `job: null` and its change writes the unit alone, in
   * one commit conditioned on the unit's update time (a lost race reads both again).
   */
  private async commitSweptUnit<T>(keys: UnitKeys, decide: (current: AnyCurrent) => Change<T> | Promise<Change<T>>): Promise<Change<T>> {
    const jobRef = this.jobRef(keys.jobId);
    const unitRef = this.unitRef(keys.jobId, keys.phase, keys.unit);
    return this.retryingWrite(`unit ${keys.jobId}/${keys.unit}`, async () => {
      for (let attempt = 1; ; attempt += 1) {
        try {
          return await this.commitUnitRecord(keys, (current) => decide({ ...(current as UnitCurrent), unreadable: null } satisfies SweptUnitCurrent));
        } catch (error) {
          if (!(error instanceof OwnershipLostError) && !(error instanceof UnreadableJobError)) throw error;
          const [jobSnapshot, unitSnapshot] = await this.db.getAll(jobRef, unitRef);
          if (!unitSnapshot?.exists) throw error;
          let unreadable: UnreadableJobError | null = null;
          if (jobSnapshot?.exists) {
            try {
              decodeJob(keys.jobId, jobSnapshot.data());
              // It reads now (a refusal of decide's, or repaired meanwhile): a refusal stands, a repair is decided again.
              if (error instanceof OwnershipLostError) throw error;
              continue;
            } catch (decodeError) {
              if (!(decodeError instanceof UnreadableJobError)) throw decodeError;
              unreadable = decodeError;
            }
          }
          const unit = decodeUnit(unitRef.path, unitSnapshot.data());
          const change = await decide({ job: null, unreadable, unit });
          if (change.next || change.events?.length || change.documents?.length || dispatchesOf(change).length > 0) throw new Error(`unit ${unitRef.path}: without its job, a change writes the unit alone`, { cause: error });
          if (!change.nextUnit) return change;
          const writer = new CountingBatch(this.db.batch());
          this.commitUnit(writer, unitSnapshot, change.nextUnit, unit);
          try {
            await writer.batch.commit();
            return change;
          } catch (commitError) {
            if (!isFailedPrecondition(commitError) || attempt >= MAX_JOB_COMMIT_ATTEMPTS) throw commitError;
            noteCommitPreconditionFailed();
          }
        }
      }
    });
  }

  /** A decided change, its documents added to the commit: the value the commit protocols carry is the whole change. */
  private async decided<T>(tx: JobWriter, job: JobRecord, decision: Change<T> | Promise<Change<T>>): Promise<{ next?: JobRecord; nextUnit?: UnitRecord; events?: readonly EventDraft[]; value: Change<T> }> {
    const change = await decision;
    if (this.queue === null && dispatchesOf(change).length > 0) throw new Error(`job ${job.id}: a change with tasks to enqueue needs a store with a task queue (dispatchingTo)`);
    this.writeDocuments(tx, job, change.documents ?? []);
    return { ...(change.next ? { next: change.next } : {}), ...(change.nextUnit ? { nextUnit: change.nextUnit } : {}), ...(change.events ? { events: change.events } : {}), value: change };
  }

  /** The holder of a unit claim: refused unless it still holds (records and slot); the unit is written in any case. */
  private async commitHeldUnit<T>(owner: Extract<DoorOwner, { kind: 'unit' }>, decide: (current: AnyCurrent) => Change<T> | Promise<Change<T>>): Promise<Change<T>> {
    const { claim } = owner;
    const whileRacing = owner.whileRacing;
    const renew = whileRacing
      ? async (unit: UnitRecord) => {
          const renewed = whileRacing(unit);
          if (renewed === null) return false;
          await this.commitHeldUnit({ kind: 'unit', claim }, () => ({ nextUnit: renewed, value: undefined }));
          return true;
        }
      : undefined;
    const committed = await this.commitUnitChange(
      claim,
      async ({ tx, job, unit, slot }) => {
        refuseUnlessUnitHeld(job, unit, slot, claim);
        const change = await this.decided(tx, job, decide({ job, unit, slot }));
        return { ...change, nextUnit: change.nextUnit ?? unit };
      },
      renew ? { beforeRetry: renew } : {},
    );
    this.noteUnitSlotWrite(committed.value.nextUnit ?? null, committed.slotUpdateTime);
    return committed.value;
  }

  /** A decider from the unit's records (a claimer): a change without `nextUnit` writes nothing. */
  private async commitUnitRecord<T>(keys: UnitKeys, decide: (current: AnyCurrent) => Change<T> | Promise<Change<T>>): Promise<Change<T>> {
    const committed = await this.commitUnitChange(keys, async ({ tx, job, unit, slot }) => this.decided(tx, job, decide({ job, unit, slot })));
    this.noteUnitSlotWrite(committed.value.nextUnit ?? null, committed.slotUpdateTime);
    return committed.value;
  }

  /** A unit commit rewrote the unit's claim slot: a session of the claim it leaves held starts from that write, with no read. */
  private noteUnitSlotWrite(unit: UnitRecord | null, slotUpdateTime: Timestamp | null): void {
    const epoch = unit === null ? null : heldUnitEpoch(unit);
    if (unit === null || epoch === null || slotUpdateTime === null) return;
    this.memory.slotWritten(claimPath(unit.jobId, unitClaimSlot(unit.phase, unit.unit)), epoch, slotUpdateTime);
  }

  /**
   * A holder's write that touches neither its job nor its unit record: one commit fenced by the claim
   * slot (ClaimSession), decided once (a commit the session repeats after a lost answer writes the
   * same documents and events).
   */
  private async commitFencedBySlot<T>(holder: ClaimHolder, job: EventJob | undefined, decide: (current: AnyCurrent) => Change<T> | Promise<Change<T>>): Promise<Change<T>> {
    const change = await decide({});
    if (change.next || change.nextUnit || dispatchesOf(change).length > 0) throw new Error('a write fenced by its claim slot changes no job or unit record and dispatches nothing');
    const documents = change.documents ?? [];
    const events = change.events ?? [];
    if (events.length > 0 && (holder.kind !== 'unit' || job === undefined)) throw new Error('a slot-fenced write tells events only for a unit holder that names its job');
    const eventDocuments = holder.kind === 'unit' && job !== undefined ? this.unitEventDocuments(job, holder.claim, events) : [];
    await this.sessionOf(holder).commit(slotWriteLabel(documents), (batch) => {
      this.writeDocuments(batch, { id: holder.claim.jobId, conversationId: null }, documents);
      for (const { ref, data } of eventDocuments) batch.set(ref, data);
    });
    return change;
  }

  /** The documents a change carries, added to its commit. */
  private writeDocuments(tx: JobWriter, job: Pick<JobRecord, 'id' | 'conversationId'>, documents: readonly DocumentWrite[]): void {
    for (const write of documents) {
      switch (write.kind) {
        case 'checkpoint':
          tx.set(this.checkpointRef(job.id, write.phase), write.document);
          break;
        case 'outbox':
          tx.create(outboxRef(this, job), write.document);
          break;
        case 'section':
          tx.create(sectionRef(this, job.id, write.phase, write.unit, write.id), write.document);
          break;
        case 'transcript-save':
          tx.set(transcriptSaveRef(this, job.id, write.phase, write.unit, write.id, write.save), write.document);
          break;
        case 'unit-flush':
          tx.update(this.unitRef(write.unit.jobId, write.unit.phase, write.unit.unit), encodeUnitFlush(write.unit));
          break;
        case 'unit':
          this.rewriteUnit(tx, write.read, write.next);
          break;
        case 'fan-out-units':
          this.putFanOutUnits(tx, write.units);
          break;
        case 'create':
          tx.create(this.db.doc(write.path), write.document);
          break;
        case 'put':
          tx.set(this.db.doc(write.path), write.document);
          break;
        case 'update-read':
          tx.update(this.db.doc(write.read.path), write.fields, { lastUpdateTime: write.read.updateTime });
          break;
        case 'delete-read':
          tx.delete(this.db.doc(write.read.path), { lastUpdateTime: write.read.updateTime });
          break;
        case 'unchanged':
          tx.update(this.db.doc(write.read.path), { [write.field]: write.value }, { lastUpdateTime: write.read.updateTime });
          break;
      }
    }
  }

  /** After a commit: its tasks. The state change is durable whatever happens here; the sweeper re-dispatches a queued job or unit whose task went missing. */
  private async enqueue(dispatches: readonly Dispatch[]): Promise<void> {
    for (const { task, id, delayMs } of dispatches) {
      try {
        await this.queue?.enqueue(task, { id, delaySeconds: delayMs / 1000 });
      } catch (error) {
        this.log?.('enqueue failed; the sweeper will re-dispatch', { task, error: describeError(error) });
      }
    }
  }


  async read(jobId: string): Promise<JobRecord | null> {
    const snapshot = await this.jobRef(jobId).get();
    return snapshot.exists ? decodeJob(jobId, snapshot.data()) : null;
  }

  /**
   * Writes a new queued job. With an idempotency key the job ID is derived from owner and key,
   * so a repeated submit finds the same job instead of making a second one. `admission` (the
   * owner's limits) is decided only for a new job: a repeat is never refused nor counted again.
   * Plain reads, then one commit that creates the job (and its conversation's record, which names
   * the owner so that security rules let only them read its messages) and writes the usage the
   * admission decided, conditioned on the usage as read: no lock is held, and a submit that lost a
   * race (its job, its conversation or its usage changed meanwhile) reads again and decides again.
   */
  async createJob(request: NewJob, admission?: JobAdmission): Promise<CreateJobResult> {
    const nowMs = this.clock.now();
    const ref = request.idempotencyKey
      ? this.jobRef(jobIdForIdempotencyKey(request.owner, request.idempotencyKey))
      : this.db.collection(JOBS).doc();
    const fingerprint = requestFingerprint(request);
    const conversationRef = request.conversationId ? this.db.doc(conversationPath(request.conversationId)) : null;
    // The job this call creates carries its mark: a create whose answer was lost (the SDK's retry of it hears ALREADY_EXISTS) is found to be ours.
    const mark = randomUUID();
    let sent: JobRecord | null = null;
    return this.retryingWrite(`submit of job ${ref.id}`, async () => {
      for (let attempt = 1; ; attempt += 1) {
        // One read time for the job, its conversation and what the admission decides from.
        const admissionReads = admission?.reads(nowMs) ?? [];
        const [snapshot, ...others] = await this.db.getAll(ref, ...admissionReads, ...(conversationRef ? [conversationRef] : []));
        const conversation = conversationRef ? others.at(-1) : undefined;
        if (snapshot?.exists) {
          const existing = decodeJob(ref.id, snapshot.data());
          if (sent !== null && snapshot.get(COMMIT_MARK_FIELD) === mark) return { created: true, job: sent };
          if (snapshot.get('requestFingerprint') !== fingerprint) return { conflict: true as const, job: existing };
          return { created: false, job: existing };
        }
        if (conversation?.exists && conversation.get('owner') !== request.owner) {
          throw new PhaselineError('invalid_input', false, 'That conversation belongs to someone else.');
        }
        const admitted = admission ? await admission.decide(others.slice(0, admissionReads.length), ref.id, nowMs) : null;
        if (admitted && 'refused' in admitted) return { refused: admitted.refused };
        const job = newQueuedJob(
          {
            id: ref.id,
            owner: request.owner,
            pipeline: request.pipeline,
            input: request.input,
            conversationId: request.conversationId,
            idempotencyKey: request.idempotencyKey,
            pipelineVersion: request.pipelineVersion ?? null,
          },
          nowMs,
        );
        const batch = this.db.batch();
        batch.create(ref, { ...encodeJob(job), requestFingerprint: fingerprint, [COMMIT_MARK_FIELD]: mark });
        batch.create(this.db.doc(eventPath(ref.id, eventId(1))), eventDocument(job, { kind: 'submitted', message: `Submitted to ${job.pipeline}${job.pipelineVersion ? ` (version ${job.pipelineVersion})` : ''}` }, nowMs));
        if (conversationRef && !conversation?.exists) batch.create(conversationRef, { owner: request.owner, createdAtMs: nowMs });
        admitted?.admit(batch);
        try {
          await batch.commit();
        } catch (error) {
          if (mayHaveLanded(error)) sent = job;
          if (!isFailedPrecondition(error) && !isAlreadyExists(error)) throw error;
          noteCommitPreconditionFailed();
          if (attempt >= MAX_SUBMIT_COMMIT_ATTEMPTS) throw new CheckpointWriteError(`submit of job ${ref.id}: its usage or documents kept changing under ${attempt} conditioned commits`, error);
          // Submits of one user at once race on their usage document: a short random pause keeps the losers from colliding again in lockstep.
          await new Promise((resolve) => setTimeout(resolve, Math.floor(Math.random() * Math.min(UNIT_RACE_PAUSE_CAP_MS, UNIT_RACE_PAUSE_STEP_MS * attempt))));
          continue;
        }
        return { created: true, job };
      }
    });
  }

  /**
   * Decides from the job record and commits the record `body` returns, with its events and whatever
   * else `body` wrote, in one commit conditioned on the job's update time. `check` decides whether
   * the caller may write at all; a refusal is an OwnershipLostError and nothing is written. When
   * the precondition fails, or a document `body` creates has appeared meanwhile, the job is read
   * again and `body` runs again on what it now says (it must be free of side effects; it may read
   * other documents, which a document it writes under their own precondition can fence). A holder
   * that committed last skips the read (see asOwner).
   * Transient Firestore failures are retried; past that the write is a CheckpointWriteError.
   */
  async transact<T>(jobId: string, check: (job: JobRecord) => string | null, body: (context: JobTransaction) => Promise<JobChange<T>>, holder?: JobClaim): Promise<T> {
    const ref = this.jobRef(jobId);
    let unconfirmed: (UnconfirmedCommit<T> & { readonly before: JobRecord }) | null = null;
    return this.retryingWrite(`job ${jobId}`, async () => {
      for (let attempt = 1; ; attempt += 1) {
        const view: OwnerView | FreshVersion = (unconfirmed === null && holder && this.ownerView(holder)) || (await this.readVersion(ref));
        if (unconfirmed !== null) {
          const pending = unconfirmed;
          unconfirmed = null;
          if ('fresh' in view && view.mark === pending.mark) {
            // It landed: go on from it as from an answered commit (its dispatch, a claim's step).
            this.rememberOwnerView(pending.before, view.record, view.updateTime);
            await this.revokeEndedFanOuts(pending.writer);
            return pending.value;
          }
        }
        const refusal = check(view.record);
        if (refusal !== null) throw new OwnershipLostError(refusal);
        const writer = new CountingBatch(this.db.batch());
        const { next, events = [], value } = await body({ tx: writer, job: view.record });
        // Every other write of the commit is fenced by the job's precondition: with none of its own, the job is rewritten as it is.
        const committed = next ?? (writer.writes > 0 ? view.record : null);
        if (committed === null) {
          // Nothing to commit, so no precondition proves anything: a decision made from a remembered record is made again from a read.
          if (!('fresh' in view)) {
            this.memory.ownerViews.delete(jobId);
            continue;
          }
          return value;
        }
        const record = this.commitJob(writer, { ref, updateTime: view.updateTime }, view.record, committed, events);
        let results;
        try {
          results = await writer.batch.commit();
        } catch (error) {
          this.forgetOwnerView(jobId, view.updateTime);
          // No answer is not no commit, and a lost race may be our own commit met by the SDK's retry of it (UnconfirmedCommit):
          // the next try (here, or retryingWrite's) reads the job first and looks for this commit's mark.
          if (mayHaveLanded(error)) unconfirmed = { mark: this.commitMark(writer), value, writer, before: view.record };
          // A document the commit creates appeared since the decision (someone else acted): decided again, like a changed job.
          if (!isFailedPrecondition(error) && !isAlreadyExists(error)) throw error;
          noteCommitPreconditionFailed();
          if (attempt >= MAX_JOB_COMMIT_ATTEMPTS) throw new CheckpointWriteError(`job ${jobId} kept changing under ${attempt} conditioned commits`, error);
          continue;
        }
        // The job's own write is the commit's last (commitJob): its update time conditions the holder's next commit.
        this.rememberOwnerView(view.record, record, results.at(-1)?.writeTime);
        await this.revokeEndedFanOuts(writer);
        return value;
      }
    });
  }

  /** As `transact`, in a Firestore transaction: for changes that read other documents to decide. */
  async transactReading<T>(jobId: string, check: (job: JobRecord) => string | null, body: (context: ReadingJobTransaction) => Promise<JobChange<T>>): Promise<T> {
    const ref = this.jobRef(jobId);
    const value = await this.retryingWrite(`job ${jobId}`, () =>
      this.runTransaction(async (tx) => {
        const snapshot = await tx.get(ref);
        if (!snapshot.exists) throw new OwnershipLostError(`Job ${jobId} does not exist`);
        const job = decodeJob(jobId, snapshot.data());
        const refusal = check(job);
        if (refusal !== null) throw new OwnershipLostError(refusal);
        const { next, events = [], value } = await body({ tx, job, snapshot });
        if (next) this.commitJob(tx, snapshot, job, next, events);
        return value;
      }),
    );
    // Its update time is not known here: the holder's next commit reads the job first.
    this.memory.ownerViews.delete(jobId);
    return value;
  }

  /**
   * A commit of the holder of a job claim: refused unless the claim still holds; no read while its last commit stands.
   * Old door, kept until its last callers outside engine/step move: use apply({ kind: 'job', claim }, decide)
   */
  async asOwner<T>(claim: JobClaim, body: (context: JobTransaction) => Promise<JobChange<T>>): Promise<T> {
    return this.transact(claim.jobId, (job) => jobClaimRefusal(job, claim), body, claim);
  }

  /**
   * An owner-checked Firestore transaction, for a holder's change that reads other documents to decide.
   * Old door, a Firestore transaction: no engine path uses it any more (tests still drive it); everything uses apply
   */
  async asOwnerReading<T>(claim: JobClaim, body: (context: ReadingJobTransaction) => Promise<JobChange<T>>): Promise<T> {
    return this.transactReading(claim.jobId, (job) => jobClaimRefusal(job, claim), body);
  }

  private ownerView(claim: JobClaim): OwnerView | undefined {
    const view = this.memory.ownerViews.get(claim.jobId);
    return view?.epoch === claim.epoch ? view : undefined;
  }

  private rememberOwnerView(before: JobRecord, record: JobRecord, updateTime: Timestamp | undefined): void {
    const previous = this.memory.ownerViews.get(record.id);
    // A late answer of an older commit leaves a newer view alone.
    if (previous && updateTime && previous.updateTime.valueOf() > updateTime.valueOf()) return;
    this.memory.ownerViews.delete(record.id);
    const epoch = heldJobEpoch(record);
    if (epoch === null || updateTime === undefined) return;
    // The commit that gave the claim wrote the slot (syncClaimSlot); later commits of the holder leave it alone.
    const slotUpdateTime = heldJobEpoch(before) !== epoch ? updateTime : previous?.epoch === epoch ? previous.slotUpdateTime : null;
    // Exactly what a read would decode: the next decision is made from the stored record, not the one in hand.
    remember(this.memory.ownerViews, record.id, { epoch, record: decodeJob(record.id, encodeJob(record)), updateTime, slotUpdateTime });
  }

  /** Drops the remembered view a failed commit was conditioned on; a newer one (another claimer's win) stays. */
  private forgetOwnerView(jobId: string, usedUpdateTime: Timestamp | undefined): void {
    const view = this.memory.ownerViews.get(jobId);
    if (view && (usedUpdateTime === undefined || view.updateTime.isEqual(usedUpdateTime))) this.memory.ownerViews.delete(jobId);
  }

  private async readVersion(ref: DocumentReference): Promise<FreshVersion> {
    const snapshot = await ref.get();
    if (!snapshot.exists) throw new OwnershipLostError(`Job ${ref.id} does not exist`);
    return { fresh: true, record: decodeJob(ref.id, snapshot.data()), updateTime: snapshot.updateTime, mark: snapshot.get(COMMIT_MARK_FIELD) as unknown };
  }

  /** This commit attempt's mark (made on first use). */
  private commitMark(writer: object): string {
    let mark = this.commitMarks.get(writer);
    if (mark === undefined) {
      mark = randomUUID();
      this.commitMarks.set(writer, mark);
    }
    return mark;
  }

  /**
   * Owner-checked transaction for the holder of a unit claim: the unit and its job are both read and checked.
   * Old door, a Firestore transaction: no engine path uses it any more (tests still drive it); everything uses apply
   */
  async asUnitOwner<T>(
    claim: UnitClaim,
    body: (context: ReadingJobTransaction & { unit: UnitRecord; unitSnapshot: DocumentSnapshot }) => Promise<{
      next?: JobRecord;
      nextUnit?: UnitRecord;
      events?: readonly EventDraft[];
      value: T;
    }>,
  ): Promise<T> {
    const jobRef = this.jobRef(claim.jobId);
    const unitRef = this.unitRef(claim.jobId, claim.phase, claim.unit);
    return this.retryingWrite(`unit ${claim.jobId}/${claim.unit}`, () =>
      this.runTransaction(async (tx) => {
        const [snapshot, unitSnapshot] = await tx.getAll(jobRef, unitRef);
        if (!snapshot?.exists || !unitSnapshot?.exists) throw new OwnershipLostError(`Unit ${claim.jobId}/${claim.unit} does not exist`);
        const job = decodeJob(claim.jobId, snapshot.data());
        const unit = decodeUnit(unitRef.path, unitSnapshot.data());
        const refusal = unitClaimRefusal(job, unit, claim);
        if (refusal !== null) throw new OwnershipLostError(refusal);
        const { next, nextUnit, events = [], value } = await body({ tx, job, snapshot, unit, unitSnapshot });
        if (nextUnit) this.commitUnit(tx, unitSnapshot, nextUnit);
        if (next) this.commitJob(tx, snapshot, job, next, events.map((event) => ({ ...event, unit: claim.unit })));
        else for (const { ref, data } of this.unitEventDocuments(job, unit, events)) tx.create(ref, data);
        return value;
      }),
    );
  }

  /**
   * As `asUnitOwner` for a change that decides from the job and unit records alone, through
   * `commitUnitChange`: the claim must still hold (the unit's, its job's fan-out, and the slot held
   * at the claim's epoch), and the unit is written in any case (as it is when `body` changes nothing
   * of it), so that its precondition and the slot's fence the commit. `body` must be free of side effects.
   * Old door, kept until its last callers outside engine/step move: use apply({ kind: 'unit', claim }, decide)
   */
  async commitAsUnitOwner<T>(claim: UnitClaim, body: (context: { tx: JobWriter; job: JobRecord; unit: UnitRecord }) => Promise<UnitChange<T>>, options: UnitCommitOptions = {}): Promise<T> {
    const committed = await this.commitUnitChange(claim, async ({ tx, job, unit, slot }) => {
      refuseUnlessUnitHeld(job, unit, slot, claim);
      const change = await body({ tx, job, unit });
      return { ...change, nextUnit: change.nextUnit ?? unit };
    }, options);
    return committed.value;
  }

  /**
   * One change to a unit, decided from the job, the unit and the unit's claim slot as read now (one
   * round trip, no transaction), committed in one batch conditioned on the unit's and the slot's
   * update times (the slot is written in any case: created if it did not exist yet) and on the
   * job's when the change writes the job. The slot stands in for the job when the job is not
   * written: every commit that ends a fan-out revokes its slots. Nothing is locked while `decide`
   * runs, so units claiming or finishing at once never wait on each other's locks (the emulator held
   * the loser of two finishing transactions about three seconds); the one whose precondition failed
   * reads again and decides again from what the other committed. A change without `nextUnit`
   * writes nothing (a refusal). `decide` must be free of side effects. Resolves to its value and,
   * when it committed, the slot's new update time (a session of the claim it made starts from it).
   */
  async commitUnitChange<T>(
    ids: Pick<UnitClaim, 'jobId' | 'phase' | 'unit'>,
    decide: (context: { tx: JobWriter; job: JobRecord; unit: UnitRecord; slot: ClaimSlotView }) => Promise<UnitChange<T>>,
    options: UnitCommitOptions = {},
  ): Promise<{ value: T; slotUpdateTime: Timestamp | null }> {
    const jobRef = this.jobRef(ids.jobId);
    const unitRef = this.unitRef(ids.jobId, ids.phase, ids.unit);
    const slotRef = this.claimSlotRef(ids.jobId, unitClaimSlot(ids.phase, ids.unit));
    let unconfirmed: (UnconfirmedCommit<T> & { readonly wroteJob: boolean; readonly raced?: UnitRecord; readonly refused?: Error }) | null = null;
    return this.retryingWrite(`unit ${ids.jobId}/${ids.unit}`, async () => {
      for (let attempt = 1; ; attempt += 1) {
        const [snapshot, unitSnapshot, slotSnapshot] = await this.db.getAll(jobRef, unitRef, slotRef);
        if (!snapshot?.exists || !unitSnapshot?.exists || !slotSnapshot) throw new OwnershipLostError(`Unit ${ids.jobId}/${ids.unit} does not exist`);
        if (unconfirmed !== null) {
          const pending = unconfirmed;
          unconfirmed = null;
          // Every commit of this path writes the unit: its mark tells whether the lost answer's commit landed.
          if (unitSnapshot.get(COMMIT_MARK_FIELD) === pending.mark) {
            if (pending.wroteJob) this.memory.ownerViews.delete(ids.jobId);
            await this.revokeEndedFanOuts(pending.writer);
            // The slot's update time as written is not known: a session of this claim reads it first.
            return { value: pending.value, slotUpdateTime: null };
          }
          this.endedFanOuts.delete(pending.writer);
          // Not ours: a document the commit creates was there already (nothing landed), as the caller hears it.
          if (pending.refused !== undefined) throw pending.refused;
          // A race really lost: what runs between tries runs now (not when the race was our own commit).
          if (pending.raced !== undefined && (await options.beforeRetry?.(pending.raced))) continue;
        }
        const job = decodeJob(ids.jobId, snapshot.data());
        const unit = decodeUnit(unitRef.path, unitSnapshot.data());
        const slot: ClaimSlotView = { exists: slotSnapshot.exists, state: slotSnapshot.get('state') as unknown, epoch: slotSnapshot.get('epoch') as unknown };
        const writer = new CountingBatch(this.db.batch());
        this.endedFanOuts.set(writer, []);
        const decided = await decide({ tx: writer, job, unit, slot });
        const { nextUnit, events = [], value } = decided;
        if (!nextUnit) {
          this.endedFanOuts.delete(writer);
          return { value, slotUpdateTime: null };
        }
        // A fan-out recorded without its unit IDs has its slots revoked only after the commit that ends it:
        // a change to one of its units is conditioned on the job itself (rewritten as read), as a transaction's read of it was.
        const next = decided.next ?? (job.fanout !== null && job.fanout.unitIds === undefined ? job : undefined);
        const slotWrite = writer.writes;
        this.commitUnit(writer, unitSnapshot, nextUnit, unit, { updateTime: slotSnapshot.exists ? (slotSnapshot.updateTime ?? null) : null });
        if (next) this.commitJob(writer, snapshot, job, next, events.map((event) => ({ ...event, unit: ids.unit })));
        else for (const { ref, data } of this.unitEventDocuments(job, unit, events)) writer.create(ref, data);
        let results;
        try {
          results = await writer.batch.commit();
        } catch (error) {
          if (!mayHaveLanded(error)) {
            this.endedFanOuts.delete(writer);
            throw error;
          }
          // A slot that was missing at the read and is there now was made by another commit: read again, as for a precondition.
          const raced = isFailedPrecondition(error) || (isAlreadyExists(error) && !slotSnapshot.exists);
          // No answer is not no commit, and a lost race may be our own commit met by the SDK's retry of it (UnconfirmedCommit):
          // the next try (here, or retryingWrite's) reads the unit first and looks for this commit's mark.
          const mark = this.commitMark(writer);
          unconfirmed = { mark, value, writer, wroteJob: next !== undefined, ...(isTransientFirestoreError(error) ? {} : raced ? { raced: unit } : { refused: error instanceof Error ? error : new Error(String(error)) }) };
          if (!raced) {
            if (isTransientFirestoreError(error)) throw error;
            continue;
          }
          noteCommitPreconditionFailed();
          // Every unit of a fan-out may finish at once, each writing the job: each round one of them lands, so the last may need a try per sibling.
          const allowed = MAX_JOB_COMMIT_ATTEMPTS + 2 * (job.fanout?.units ?? 0);
          if (attempt >= allowed) throw new CheckpointWriteError(`unit ${ids.jobId}/${ids.unit} kept changing under ${attempt} conditioned commits`, error);
          // A short random pause spreads the racers out, so they do not collide again in lockstep.
          await new Promise((resolve) => setTimeout(resolve, Math.floor(Math.random() * Math.min(UNIT_RACE_PAUSE_CAP_MS, UNIT_RACE_PAUSE_STEP_MS * attempt))));
          continue;
        }
        if (next) this.memory.ownerViews.delete(ids.jobId);
        await this.revokeEndedFanOuts(writer);
        return { value, slotUpdateTime: results[slotWrite]?.writeTime ?? null };
      }
    });
  }

  /** A new owner-write session of a job claim (the lower floor of `apply` with a `slot` owner): see ClaimSession. */
  jobSession(claim: JobClaim): ClaimSession {
    return this.newSession({ kind: 'job', claim }, null);
  }

  /** A new owner-write session of a unit claim, from the slot's update time when this process made the claim (else its first write reads the slot). */
  unitSession(claim: UnitClaim, slotUpdateTime: Timestamp | null = null): ClaimSession {
    return this.newSession({ kind: 'unit', claim }, slotUpdateTime);
  }

  private newSession(holder: ClaimHolder, slotUpdateTime: Timestamp | null): ClaimSession {
    const { claim } = holder;
    if (holder.kind === 'job') {
      // Seeded with the slot's update time when this process made the claim: the first write needs no read either.
      return new ClaimSession(this, this.claimSlotRef(claim.jobId, JOB_CLAIM_SLOT), claim.epoch, `job ${claim.jobId}`, slotUpdateTime ?? this.ownerView(holder.claim)?.slotUpdateTime ?? null);
    }
    const { phase, unit } = holder.claim;
    return new ClaimSession(this, this.claimSlotRef(claim.jobId, unitClaimSlot(phase, unit)), claim.epoch, `unit ${claim.jobId}/${phase}~${unit}`, slotUpdateTime);
  }

  /** The one owner-write session of a claim in this process: its writes land in the order made, each fenced by the slot. */
  private sessionOf(holder: ClaimHolder): ClaimSession {
    const { claim } = holder;
    const slot = holder.kind === 'job' ? JOB_CLAIM_SLOT : unitClaimSlot(holder.claim.phase, holder.claim.unit);
    return this.memory.session(claimPath(claim.jobId, slot), claim.epoch, (known) => (holder.kind === 'job' ? this.jobSession(holder.claim) : this.unitSession(holder.claim, known)));
  }


  /**
   * A Firestore transaction whose job commits may end a fan-out: once it has committed, the units
   * still running under that fan-out lose their claims (their slots are revoked), so their next
   * owner write fails instead of landing in a job that moved on. Every engine transaction that can
   * commit a job record goes through here.
   */
  async runTransaction<T>(body: (tx: Transaction) => Promise<T>): Promise<T> {
    const attempts: Transaction[] = [];
    const value = await this.db.runTransaction((tx) => {
      // Each attempt starts its own list: only what the attempt that committed ended counts.
      attempts.push(tx);
      this.endedFanOuts.set(tx, []);
      return body(tx);
    });
    const committed = attempts.at(-1);
    if (committed) await this.revokeEndedFanOuts(committed);
    return value;
  }

  /** After a commit: the fan-outs it ended without their unit IDs on record lose their running units' claims. */
  private async revokeEndedFanOuts(writer: object): Promise<void> {
    const ended = this.endedFanOuts.get(writer) ?? [];
    this.endedFanOuts.delete(writer);
    for (const { jobId, fanout } of ended) {
      // Best effort after the fact: the commit stands whatever happens here (never retried with it).
      await this.revokeUnitsOf(jobId, fanout).catch((error: unknown) => {
        console.warn(`revoking the unit claims of job ${jobId}'s ended fan-out failed; their next heartbeat stops them`, error);
      });
    }
  }

  /**
   * Revokes the claims of a fan-out's units still marked running. Each revocation is decided from the
   * unit as read and committed conditioned on that read (no transaction: a process that dies here
   * locks nothing): a unit a later fan-out has rewritten since (and maybe given to a new worker) fails
   * the precondition and is read again, then left alone. If this process dies first, the unit's next
   * heartbeat, which reads the job, stops it instead.
   */
  private async revokeUnitsOf(jobId: string, fanout: FanOutState): Promise<void> {
    for (const found of await readFanOutUnits(this, jobId, fanout.epoch)) {
      let snapshot: DocumentSnapshot = found;
      for (let attempt = 1; snapshot.exists && snapshot.updateTime; attempt += 1) {
        const unit = decodeUnit(snapshot.ref.path, snapshot.data());
        const held = heldUnitEpoch(unit);
        if (unit.fanoutEpoch !== fanout.epoch || held === null) break;
        const batch = this.db.batch();
        // The unit written back as read (its update time stays): the fence that this is still the unit decided from.
        batch.update(snapshot.ref, { fanoutEpoch: unit.fanoutEpoch }, { lastUpdateTime: snapshot.updateTime });
        const revoked: ClaimSlotRecord = { epoch: held, state: 'revoked', worker: null, atMs: this.clock.now() };
        batch.set(this.claimSlotRef(jobId, unitClaimSlot(unit.phase, unit.unit)), revoked);
        try {
          await batch.commit();
          break;
        } catch (error) {
          if (!isFailedPrecondition(error) || attempt >= MAX_JOB_COMMIT_ATTEMPTS) throw error;
          snapshot = await snapshot.ref.get();
        }
      }
    }
  }

  /**
   * Keeps a claim slot in step with the record that decides it, in the same commit: a new holder
   * (claim, takeover) writes its epoch, a holder leaving (hand-off, reclaim, cancel, failure) writes
   * the slot revoked. Either write changes the slot's update time, so every write a previous holder
   * still makes under its precondition fails (see ClaimSession). No read: the records say it all.
   */
  private syncClaimSlot(tx: JobWriter, ref: DocumentReference, before: number | null, after: number | null, worker: string | null): void {
    if (before === after) return;
    tx.set(ref, this.slotRecord(before, after, worker));
  }

  private slotRecord(before: number | null, after: number | null, worker: string | null): ClaimSlotRecord {
    const nowMs = this.clock.now();
    return after !== null ? { epoch: after, state: 'held', worker, atMs: nowMs } : { epoch: before ?? 0, state: 'revoked', worker: null, atMs: nowMs };
  }

  /** The slot as syncClaimSlot would leave it, in one write conditioned on the slot as read (one write per document per commit). */
  private writeFencedSlot(tx: JobWriter, ref: DocumentReference, fence: SlotFence, before: number | null, after: number | null, worker: string | null): void {
    const lastWrite = { lastWriteAtMs: this.clock.now() };
    const changed = before === after ? null : this.slotRecord(before, after, worker);
    if (fence.updateTime) tx.update(ref, { ...changed, ...lastWrite }, { lastUpdateTime: fence.updateTime });
    // A unit from before claim slots existed: its slot is made now, and creating it fails if another commit made it first.
    else tx.create(ref, { ...(changed ?? this.slotRecord(null, after, worker)), ...lastWrite });
  }

  /**
   * The job leaves its fan-out (joined, or ended early by a cancel, a failure, a wait or a
   * quarantine): every unit's claim slot is revoked in this same commit, so a unit still running
   * cannot record anything once the commit lands. Blind writes, no read: every unit of an ended
   * fan-out is stale, and a later fan-out only starts after this commit. A fan-out recorded without
   * its unit IDs falls back to revoking after the commit (see runTransaction).
   */
  private endFanOut(tx: JobWriter, jobId: string, fanout: FanOutState): void {
    if (fanout.unitIds === undefined) {
      const ended = this.endedFanOuts.get(tx) ?? [];
      ended.push({ jobId, fanout });
      this.endedFanOuts.set(tx, ended);
      return;
    }
    const nowMs = this.clock.now();
    for (const unit of fanout.unitIds) {
      const revoked: ClaimSlotRecord = { epoch: null, state: 'revoked', worker: null, atMs: nowMs };
      tx.set(this.claimSlotRef(jobId, unitClaimSlot(fanout.phase, unit)), revoked);
    }
  }

  /**
   * Writes the next job record, conditioned on the update time decided from, with its timeline
   * events; the job's write is the last one this adds. Returns the record as written.
   */
  commitJob(tx: JobWriter, snapshot: JobVersion, current: JobRecord, proposed: JobRecord, events: readonly EventDraft[]): JobRecord {
    const nowMs = this.clock.now();
    // The transitions that end a job set this already; records built outside the table (a unit's failure) get it here.
    const next = withRetentionDue(current, proposed, nowMs);
    // An event written once the job has ended (its ending commit's own, a later reconciliation's) expires with the
    // rest of its timeline: the sweeper's stamping of the job may already be over.
    const expireAt = ENDED_STATUSES.has(next.status) ? { expireAt: Timestamp.fromMillis(expireAtMs(endedAtMs(next), this.options.retentionDays)) } : {};
    this.syncClaimSlot(tx, this.claimSlotRef(current.id, JOB_CLAIM_SLOT), heldJobEpoch(current), heldJobEpoch(next), next.lease?.worker ?? null);
    noteJobCommit(current, next, events);
    if (current.fanout !== null && (next.fanout?.epoch !== current.fanout.epoch || next.status !== 'running')) this.endFanOut(tx, current.id, current.fanout);
    let seq = current.eventSeq;
    for (const event of events) {
      seq += 1;
      tx.set(this.db.doc(eventPath(current.id, eventId(seq))), { ...eventDocument(next, event, nowMs), ...expireAt });
    }
    const record: JobRecord = { ...next, eventSeq: seq, updatedAtMs: nowMs };
    if (!snapshot.updateTime) throw new Error(`Job ${current.id}: snapshot without an update time`);
    tx.update(snapshot.ref, { ...encodeJob(record), [COMMIT_MARK_FIELD]: this.commitMark(tx) }, { lastUpdateTime: snapshot.updateTime });
    return record;
  }

  /**
   * Writes the unit record conditioned on its update time, and its claim slot when the held epoch
   * changes. With `slotFence` (the slot's update time as read; null: the slot did not exist) the
   * slot is written in any case, conditioned on it: a fan-out ended since the read fails the commit.
   */
  commitUnit(tx: JobWriter, snapshot: UnitSnapshot, next: UnitRecord, current: UnitRecord = decodeUnit(snapshot.ref.path, (snapshot as Partial<DocumentSnapshot>).data?.()), slotFence?: SlotFence): void {
    if (!snapshot.updateTime) throw new Error(`Unit ${snapshot.ref.path}: snapshot without an update time`);
    const slotRef = this.claimSlotRef(next.jobId, unitClaimSlot(next.phase, next.unit));
    if (slotFence) this.writeFencedSlot(tx, slotRef, slotFence, heldUnitEpoch(current), heldUnitEpoch(next), next.lease?.worker ?? null);
    else this.syncClaimSlot(tx, slotRef, heldUnitEpoch(current), heldUnitEpoch(next), next.lease?.worker ?? null);
    noteUnitCommit(current, next);
    tx.update(snapshot.ref, { ...encodeUnit({ ...next, updatedAtMs: this.clock.now() }), [COMMIT_MARK_FIELD]: this.commitMark(tx) }, { lastUpdateTime: snapshot.updateTime });
  }

  /** Rewrites a unit read earlier (another unit of the fan-out a change ends or joins), conditioned on the update time it was read at. */
  private rewriteUnit(tx: JobWriter, read: StoredUnit, next: UnitRecord): void {
    const { record } = read;
    this.commitUnit(tx, { ref: this.unitRef(record.jobId, record.phase, record.unit), updateTime: read.updateTime }, next, record);
  }

  /** The units of a job's fan-out (by its epoch), each with the update time a change that rewrites it is conditioned on. */
  async readFanOutUnits(jobId: string, fanoutEpoch: number): Promise<StoredUnit[]> {
    return (await readFanOutUnits(this, jobId, fanoutEpoch)).map((snapshot) => ({ record: decodeUnit(snapshot.ref.path, snapshot.data()), updateTime: snapshot.updateTime }));
  }

  /** Every unit of a job, all fan-outs, each with the update time a change that rewrites it is conditioned on. */
  async readJobUnits(jobId: string): Promise<StoredUnit[]> {
    const snapshot = await this.db.collection(unitsPath(jobId)).get();
    return snapshot.docs.map((doc) => ({ record: decodeUnit(doc.ref.path, doc.data()), updateTime: doc.updateTime }));
  }

  /**
   * Unit events go under the job without touching the hot job document, so they cannot take a
   * number from its sequence. Their IDs sort by time and stay unique without one: the commit's
   * own random part keeps two commits in the same millisecond apart. Transactions `create` them
   * (a collision fails the commit instead of overwriting an event); a holder's heartbeat `set`s
   * them, so the same commit made again after a lost answer writes the same events, not new ones.
   */
  unitEventDocuments(job: EventJob, unit: Pick<UnitRecord, 'phase' | 'unit' | 'epoch'>, events: readonly EventDraft[]): { ref: DocumentReference; data: DocumentData }[] {
    const nowMs = this.clock.now();
    const commit = randomUUID().replaceAll('-', '').slice(0, 12);
    return events.map((event, index) => {
      const id = `u-${String(nowMs).padStart(14, '0')}-${unit.phase}~${unit.unit}-${String(unit.epoch).padStart(4, '0')}-${commit}-${index}`;
      return { ref: this.db.doc(eventPath(job.id, id)), data: eventDocument(job, { ...event, unit: unit.unit }, nowMs) };
    });
  }

  /** A fan-out's units as they stand, each with the update time a commit that rewrites it is conditioned on (null: absent). */
  async readUnitVersions(jobId: string, phase: string, unitIds: readonly string[]): Promise<UnitVersion[]> {
    if (unitIds.length === 0) return [];
    const snapshots = await this.db.getAll(...unitIds.map((unit) => this.unitRef(jobId, phase, unit)));
    return snapshots.map((snapshot, position) => ({
      unit: unitIds[position] as string,
      record: snapshot.exists ? decodeUnit(snapshot.ref.path, snapshot.data()) : null,
      updateTime: snapshot.exists ? (snapshot.updateTime ?? null) : null,
    }));
  }

  /**
   * Writes the unit records a fan-out starts with, each only if it is as it was read: created where
   * there was none, replaced under its update time where there was one, so a unit that changed
   * meanwhile fails the commit (which is decided again) instead of being overwritten. Each unit's
   * claim slot is written revoked with it, so that a worker still holding a unit of an earlier
   * fan-out of this phase loses it here, not at its next heartbeat.
   */
  putFanOutUnits(tx: JobWriter, units: readonly { readonly record: UnitRecord; readonly updateTime: Timestamp | null }[]): void {
    const nowMs = this.clock.now();
    for (const { record, updateTime } of units) {
      const ref = this.unitRef(record.jobId, record.phase, record.unit);
      const data = encodeUnit({ ...record, updatedAtMs: nowMs });
      if (updateTime === null) tx.create(ref, data);
      // Every field is named, so the update replaces the record; a field the new one lacks is removed.
      else tx.update(ref, { ...data, ...('resultVersion' in data ? {} : { resultVersion: FieldValue.delete() }) }, { lastUpdateTime: updateTime });
      const revoked: ClaimSlotRecord = { epoch: record.epoch, state: 'revoked', worker: null, atMs: nowMs };
      tx.set(this.claimSlotRef(record.jobId, unitClaimSlot(record.phase, record.unit)), revoked);
    }
  }
}

/** The unit claim must still hold: its records say so, and its claim slot (when it exists) is held at the claim's epoch. */
function refuseUnlessUnitHeld(job: JobRecord, unit: UnitRecord, slot: ClaimSlotView, claim: UnitClaim): void {
  // The slot's epoch is checked with the records' (core/claims.ts); here only whether it is still held.
  const slotRevoked = slot.exists && slot.state !== 'held';
  const refusal = unitClaimRefusal(job, unit, claim, slotRevoked, slot.exists ? (typeof slot.epoch === 'number' ? slot.epoch : Number.NaN) : null);
  if (refusal !== null) throw new OwnershipLostError(refusal);
}

/** A write batch that counts what was added to it (a commit with nothing to fence needs no precondition). */
class CountingBatch implements JobWriter {
  writes = 0;

  constructor(readonly batch: WriteBatch) {}

  set(ref: DocumentReference, data: DocumentData, options?: SetOptions): this {
    this.writes += 1;
    if (options) this.batch.set(ref, data, options);
    else this.batch.set(ref, data);
    return this;
  }

  create(ref: DocumentReference, data: DocumentData): this {
    this.writes += 1;
    this.batch.create(ref, data);
    return this;
  }

  update(ref: DocumentReference, data: UpdateData<DocumentData>, precondition?: Precondition): this {
    this.writes += 1;
    if (precondition) this.batch.update(ref, data, precondition);
    else this.batch.update(ref, data);
    return this;
  }

  delete(ref: DocumentReference, precondition?: Precondition): this {
    this.writes += 1;
    this.batch.delete(ref, precondition);
    return this;
  }
}

function eventDocument(job: Pick<JobRecord, 'epoch' | 'status' | 'phase'>, event: EventDraft, nowMs: number) {
  return {
    kind: event.kind,
    message: event.message,
    unit: event.unit ?? null,
    epoch: job.epoch,
    status: job.status,
    phase: job.phase,
    atMs: nowMs,
  };
}

