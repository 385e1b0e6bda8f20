/**
 * The owner-write path: every write a claim holder makes about its own work (transcripts, sections)
 * is one batch commit conditioned on the update time of its claim slot (see JobStore.syncClaimSlot).
 * While the claim holds, a write costs one round trip and no read; the slot changes only when the
 * claim changes hands, so a precondition failure means "look": one read of the slot tells a write
 * of ours whose answer was lost (still held at our epoch: go on) from a claim taken or revoked
 * (OwnershipLostError: stop, nothing of this batch landed).
 */
import type { DocumentReference, Timestamp, WriteBatch } from 'firebase-admin/firestore';
import { CheckpointWriteError, OwnershipLostError } from '../core/errors';
import { isFailedPrecondition, type FirestoreHandle } from './firestore-handle';
import { noteCommitPreconditionFailed, traceCommit } from '../telemetry/commits';

/** What a claim slot document holds: the epoch it was last given to, and whether that claim still stands. */
export interface ClaimSlotRecord {
  /** Null when a whole fan-out's units were revoked without reading which epoch each one was at. */
  readonly epoch: number | null;
  readonly state: 'held' | 'revoked';
  readonly worker: string | null;
  readonly atMs: number;
}

/** Lost answers in a row before a write gives up: each one costs a read, so this stays small. */
const MAX_SLOT_REFRESHES = 3;

export class ClaimSession {
  private tail: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly store: FirestoreHandle,
    readonly slot: DocumentReference,
    readonly epoch: number,
    private readonly what: string,
    /** The slot's update time when the claim was made here (else the first write reads it). */
    private updateTime: Timestamp | null = null,
  ) {}

  /** Another commit of this claim's holder rewrote the slot (a unit commit does): the next write is conditioned on that write, with no read. */
  slotWrittenAt(updateTime: Timestamp): void {
    if (this.updateTime === null || this.updateTime.valueOf() < updateTime.valueOf()) this.updateTime = updateTime;
  }

  /**
   * Commits the writes `build` adds, with the slot's precondition, after every earlier commit of
   * this session (one holder's writes land in the order it made them). Resolves to what `build`
   * returned; an ALREADY_EXISTS from a `create` in the batch comes back as it is (nothing landed).
   * Transient failures are retried like every store write (FirestoreHandle.retryingWrite).
   */
  commit<T>(label: string, build: (batch: WriteBatch) => T): Promise<T> {
    const run = this.tail.then(() => traceCommit(`${label} for ${this.what}`, () => this.commitInOrder(label, build)));
    this.tail = run.catch(() => undefined);
    return run;
  }

  private async commitInOrder<T>(label: string, build: (batch: WriteBatch) => T): Promise<T> {
    for (let refreshes = 0; ; refreshes += 1) {
      try {
        return await this.store.retryingWrite(`${label} for ${this.what}`, () => this.commitOnce(build));
      } catch (error) {
        if (!isFailedPrecondition(error)) throw error;
        noteCommitPreconditionFailed();
        // Our own earlier write may have landed with its answer lost: the slot read decides.
        this.updateTime = null;
        if (refreshes >= MAX_SLOT_REFRESHES) throw new CheckpointWriteError(`${label} for ${this.what}: the claim slot kept changing under a held claim`, error);
      }
    }
  }

  private async commitOnce<T>(build: (batch: WriteBatch) => T): Promise<T> {
    const updateTime = this.updateTime ?? (await this.readSlot());
    const batch = this.store.db.batch();
    // A field of the slot itself is the write that carries the precondition: the SDK has no verify-only write.
    batch.update(this.slot, { lastWriteAtMs: this.store.clock.now() }, { lastUpdateTime: updateTime });
    const value = build(batch);
    const [slotResult] = await batch.commit();
    this.updateTime = slotResult?.writeTime ?? null;
    return value;
  }

  /** The one read: is the slot still ours? Its update time conditions the next commit. */
  private async readSlot(): Promise<Timestamp> {
    const snapshot = await this.slot.get();
    const epoch: unknown = snapshot.get('epoch');
    const state: unknown = snapshot.get('state');
    if (!snapshot.exists || state !== 'held' || epoch !== this.epoch || !snapshot.updateTime) {
      throw new OwnershipLostError(
        `Claim epoch ${this.epoch} no longer owns ${this.what} (slot ${snapshot.exists ? `${String(state)} at epoch ${String(epoch)}` : 'missing'})`,
      );
    }
    return snapshot.updateTime;
  }
}
