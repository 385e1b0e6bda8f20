/**
 * A job document the codec cannot read (a field of the wrong type, written by hand or by a bug).
 * Nothing can be decided from it, and whatever would decide from it (its task, the sweeper's rules
 * and passes, an owner's admission) fails the same way each time it finds it. So the first one to
 * find it ends it: one commit that writes only the fields the sweep queries and readers key on,
 * without decoding the rest, conditioned on the document's update time as read (a write since, a
 * repair or another finder's ending, makes it read and decide again). No lock is taken.
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
import { expireAtMs } from '../core/lifecycle';
import { endUnreadableJobStatus } from '../core/unreadable-job';
import { decodeJob } from './codec';
import type { ClaimSlotRecord } from './claim-session';
import { isAlreadyExists, isFailedPrecondition, type FirestoreHandle } from './firestore-handle';
import { eventId, eventPath, JOB_CLAIM_SLOT, unitClaimSlot } from './paths';

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

/** Commits that find the document changed, in a row, before the ending gives up (the sweep tries again next run). */
const MAX_ENDING_ATTEMPTS = 8;

/** Ends the job `error` names where it stands (see above), in one commit conditioned on the document as read. */
export async function endUnreadableJob(store: FirestoreHandle, error: UnreadableJobError): Promise<UnreadableJobEnding> {
  const ref = store.jobRef(error.jobId);
  return store.retryingWrite(`unreadable job ${error.jobId}`, async (): Promise<UnreadableJobEnding> => {
    for (let attempt = 1; ; attempt += 1) {
      const snapshot = await ref.get();
      if (!snapshot.exists || !snapshot.updateTime) return 'gone';
      const data: DocumentData = snapshot.data() ?? {};
      try {
        decodeJob(error.jobId, data);
        return 'readable';
      } catch (decodeError) {
        if (!(decodeError instanceof UnreadableJobError)) throw decodeError;
      }
      const nowMs = store.clock.now();
      const ending = endUnreadableJobStatus(data.status);
      const { ended, quarantine } = ending;
      const found = [data.lease, data.fanout, data.waiting, data.effectsToSettleAt, data.retention].some((value) => value !== null && value !== undefined);
      if (!quarantine && !found) return 'unchanged';

      const at = Timestamp.fromMillis(nowMs);
      const reason = unreadableReason(error);
      const seq = count.safeParse(data.eventSeq);
      const event = seq.success ? eventId(seq.data + 1) : `unreadable-${String(nowMs).padStart(14, '0')}`;
      const epoch = count.safeParse(data.epoch);
      const batch = store.db.batch();
      batch.update(
        ref,
        {
          lease: null,
          fanout: null,
          waiting: null,
          effectsToSettleAt: null,
          retention: null,
          updatedAt: at,
          ...(seq.success ? { eventSeq: seq.data + 1 } : {}),
          ...(quarantine ? { status: ending.status, quarantine: { reason, at }, finishedAt: at } : {}),
        },
        { lastUpdateTime: snapshot.updateTime },
      );
      batch.create(store.db.doc(eventPath(error.jobId, event)), {
        kind: quarantine ? 'quarantined' : 'unreadable',
        message: quarantine ? `Quarantined: ${reason}` : `Taken out of the sweeps: ${reason}`,
        unit: null,
        epoch: epoch.success ? epoch.data : null,
        status: ending.status,
        phase: typeof data.phase === 'string' ? data.phase : null,
        atMs: nowMs,
        ...(ended ? { expireAt: Timestamp.fromMillis(expireAtMs(nowMs, store.options.retentionDays)) } : {}),
      });
      // Blind writes, fenced by the job's precondition: every claim on the job ends with this commit.
      const revoked: ClaimSlotRecord = { epoch: epoch.success ? epoch.data : null, state: 'revoked', worker: null, atMs: nowMs };
      batch.set(store.claimSlotRef(error.jobId, JOB_CLAIM_SLOT), revoked);
      const fanout = rawFanOut.safeParse(data.fanout);
      if (fanout.success) {
        for (const unit of fanout.data.unitIds) batch.set(store.claimSlotRef(error.jobId, unitClaimSlot(fanout.data.phase, unit)), { ...revoked, epoch: null });
      }
      try {
        await batch.commit();
      } catch (commitError) {
        // Written meanwhile (or its event's ID taken): read again and decide again.
        if ((!isFailedPrecondition(commitError) && !isAlreadyExists(commitError)) || attempt >= MAX_ENDING_ATTEMPTS) throw commitError;
        continue;
      }
      return quarantine ? 'quarantined' : 'cleared';
    }
  });
}
