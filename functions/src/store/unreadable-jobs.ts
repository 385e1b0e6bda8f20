/**
 * A job document the codec cannot read (a field of the wrong type, written by hand or by a bug).
 * Nothing can be decided from it, and whatever would decide from it (its task, the sweeper's rules
 * and passes, an owner's admission) fails the same way each time it finds it. So the first one to
 * find it ends it: one transaction that writes only the fields the sweep queries and readers key
 * on, without decoding the rest.
 *
 * A job that had not ended is quarantined with the reason (JOB_TRANSITIONS.quarantineUnreadable;
 * an operator repairs the document, then releases or re-drives it). Whatever would find it again
 * is cleared: its lease, fan-out and wait, its effects check and its retention stamping; its claim
 * slots (the job's, and its fan-out's units' when the fan-out can be read) are revoked, so a worker
 * still holding it stops at its next owner write. Its timeline says why. An ended job keeps its
 * status; only what a sweep would find it by is cleared, and the timeline says so.
 */
import { Timestamp, type DocumentData } from 'firebase-admin/firestore';
import { z } from 'zod';
import { UnreadableJobError } from '../core/errors';
import { unreadableJobEnd } from '../core/unreadable-job';
import { expireAtMs } from '../core/lifecycle';
import { decodeJob } from './codec';
import { eventId, type ClaimSlotRecord, type JobStore } from './job-store';
import { eventPath, JOB_CLAIM_SLOT, unitClaimSlot } from './paths';

export type UnreadableJobEnding =
  /** Quarantined now, with the reason. */
  | 'quarantined'
  /** It had ended: what a sweep would find it by was cleared. */
  | 'cleared'
  /** An earlier finder ended it already: nothing written. */
  | 'unchanged'
  /** It reads again (repaired meanwhile): nothing written, the caller decides as usual. */
  | 'readable'
  | 'gone';

/** The parts of a fan-out record the unit slots are named by, when they can be read. */
const rawFanOut = z.object({ phase: z.string(), unitIds: z.array(z.string()) });
const count = z.number().int().nonnegative();

/** The reason a quarantine states: what the codec said, and what a person does about it. */
export function unreadableReason(error: UnreadableJobError): string {
  return `its document cannot be read (${error.message}); nothing can be decided from it: repair the document, then release or re-drive the job`;
}

/** Ends the job `error` names where it stands (see above), in one transaction conditioned on the document as read. */
export async function endUnreadableJob(store: JobStore, error: UnreadableJobError): Promise<UnreadableJobEnding> {
  const ref = store.jobRef(error.jobId);
  return store.retryingWrite(`unreadable job ${error.jobId}`, () =>
    store.db.runTransaction(async (tx): Promise<UnreadableJobEnding> => {
      const snapshot = await tx.get(ref);
      if (!snapshot.exists) return 'gone';
      const data: DocumentData = snapshot.data() ?? {};
      try {
        decodeJob(error.jobId, data);
        return 'readable';
      } catch (decodeError) {
        if (!(decodeError instanceof UnreadableJobError)) throw decodeError;
      }
      const nowMs = store.clock.now();
      const status: unknown = data.status;
      const { ended, quarantinedAs } = unreadableJobEnd(status);
      const quarantine = quarantinedAs !== null;
      const found = [data.lease, data.fanout, data.waiting, data.effectsToSettleAt, data.retention].some((value) => value !== null && value !== undefined);
      if (!quarantine && !found) return 'unchanged';

      const at = Timestamp.fromMillis(nowMs);
      const reason = unreadableReason(error);
      const seq = count.safeParse(data.eventSeq);
      const event = seq.success ? eventId(seq.data + 1) : `unreadable-${String(nowMs).padStart(14, '0')}`;
      const epoch = count.safeParse(data.epoch);
      const nextStatus = quarantinedAs ?? status;
      tx.update(ref, {
        lease: null,
        fanout: null,
        waiting: null,
        effectsToSettleAt: null,
        retention: null,
        updatedAt: at,
        ...(seq.success ? { eventSeq: seq.data + 1 } : {}),
        ...(quarantine ? { status: quarantinedAs, quarantine: { reason, at }, finishedAt: at } : {}),
      });
      tx.set(store.db.doc(eventPath(error.jobId, event)), {
        kind: quarantine ? 'quarantined' : 'unreadable',
        message: quarantine ? `Quarantined: ${reason}` : `Taken out of the sweeps: ${reason}`,
        unit: null,
        epoch: epoch.success ? epoch.data : null,
        status: nextStatus,
        phase: typeof data.phase === 'string' ? data.phase : null,
        atMs: nowMs,
        ...(ended ? { expireAt: Timestamp.fromMillis(expireAtMs(nowMs, store.options.retentionDays)) } : {}),
      });
      const revoked: ClaimSlotRecord = { epoch: epoch.success ? epoch.data : null, state: 'revoked', worker: null, atMs: nowMs };
      tx.set(store.claimSlotRef(error.jobId, JOB_CLAIM_SLOT), revoked);
      const fanout = rawFanOut.safeParse(data.fanout);
      if (fanout.success) {
        for (const unit of fanout.data.unitIds) tx.set(store.claimSlotRef(error.jobId, unitClaimSlot(fanout.data.phase, unit)), { ...revoked, epoch: null });
      }
      return quarantine ? 'quarantined' : 'cleared';
    }),
  );
}

