/**
 * Retention on Firestore: which documents expire, and the reads and writes that stamp them.
 *
 * A document expires through its `expireAt` timestamp: firestore.indexes.json declares a TTL policy
 * on that field for every collection group listed here, and Firestore deletes a document some time
 * after its `expireAt` has passed (typically within a day; the emulator never does). The job
 * document, its published answer, sections, checkpoints, units, claims and the effect ledger have
 * no such policy and stay. A TTL policy is declared per collection group: it deletes expired
 * documents of every collection with that name, at any depth, so no other collection may take
 * one of these names.
 */
import { FieldPath, FieldValue, Timestamp, type DocumentReference, type QueryDocumentSnapshot } from 'firebase-admin/firestore';
import type { JobRecord, RetentionStamping } from '../core/job';
import { decodeJob } from './codec';
import { isFailedPrecondition, type FirestoreHandle, type JobVersion } from './firestore-handle';
import type { JobCommitHandle } from './record-commits';
import { REJECTED_TASKS, SPEND_CHARGES, SPEND_DAYS } from './paths';

/** The field every TTL policy of this project reads. */
export const EXPIRE_AT = 'expireAt';

/**
 * A job's subcollections that expire once it has ended, in the order the sweeper stamps them.
 * `artifacts` and `artifactChunks` are direct subcollections of the job (pages a research step
 * kept); a job without them simply has nothing there to stamp.
 */
// Last: what re-drives set aside for audit (store/phase-documents.ts) is kept as long as the job's own timeline, no longer.
export const EXPIRING_JOB_COLLECTIONS = ['transcripts', 'events', 'drafts', 'artifacts', 'artifactChunks', 'setAside'] as const;
export type ExpiringJobCollection = (typeof EXPIRING_JOB_COLLECTIONS)[number];

/**
 * Every collection group with a TTL policy on `expireAt`: the job's expiring children, the rejected
 * tasks, the users' spend days and their charge records (store/quota-documents.ts). A policy applies
 * to every collection of that name anywhere in the database, not only under `jobs/`.
 */
export const EXPIRING_COLLECTION_GROUPS: readonly string[] = [...EXPIRING_JOB_COLLECTIONS, REJECTED_TASKS, SPEND_DAYS, SPEND_CHARGES];

/** A Firestore batch holds at most 500 writes: one page of stamps is one batch, with the job's own write. */
export const MAX_STAMPS_PER_BATCH = 499;

/** Where a stamping pass stands inside a job: the collection, and the last document ID done in it (null: from its start). */
export interface StampingPosition {
  readonly collection: ExpiringJobCollection;
  readonly afterId: string | null;
}

/** The stored cursor (`collection/docId`) as a position; an unknown or absent one starts at the beginning. */
export function parseStampingCursor(cursor: string | null): StampingPosition {
  const first: StampingPosition = { collection: EXPIRING_JOB_COLLECTIONS[0], afterId: null };
  if (cursor === null) return first;
  const slash = cursor.indexOf('/');
  const collection = EXPIRING_JOB_COLLECTIONS.find((name) => name === cursor.slice(0, slash));
  const afterId = cursor.slice(slash + 1);
  return collection === undefined ? first : { collection, afterId: afterId === '' ? null : afterId };
}

export function stampingCursor(position: StampingPosition): string | null {
  return position.afterId === null && position.collection === EXPIRING_JOB_COLLECTIONS[0] ? null : `${position.collection}/${position.afterId ?? ''}`;
}

/** The job as a stamping pass reads it: the record and the version its last commit must be conditioned on. */
export interface StampingJob {
  readonly job: JobRecord;
  readonly version: JobVersion;
}

export async function readStampingJob(store: FirestoreHandle, jobId: string): Promise<StampingJob | null> {
  const snapshot = await store.jobRef(jobId).get();
  if (!snapshot.exists) return null;
  return { job: decodeJob(jobId, snapshot.data()), version: { ref: snapshot.ref, updateTime: snapshot.updateTime } };
}

export interface StampedPage {
  /** Documents read on this page. */
  readonly read: number;
  /** Documents that needed `expireAt` (absent or different) and got it. */
  readonly stamped: number;
  /** Where the pass goes on after this page; null when the job is done. */
  readonly next: StampingPosition | null;
  /**
   * The job as this page left it: the same when nothing needed a stamp, its new version when the
   * page committed stamps. Null when the job changed since the pass read it (a re-drive runs it
   * again): the page stamped nothing, and the pass stops there.
   */
  readonly job: StampingJob | null;
}

/** The position after a page of `position`'s collection that ended at `lastId` (null: the collection is done). */
function positionAfter(position: StampingPosition, lastId: string | null): StampingPosition | null {
  if (lastId !== null) return { collection: position.collection, afterId: lastId };
  const next = EXPIRING_JOB_COLLECTIONS[EXPIRING_JOB_COLLECTIONS.indexOf(position.collection) + 1];
  return next === undefined ? null : { collection: next, afterId: null };
}

/** The job's stamping marker once the pass stands at `position`: null when it is done. */
export function stampingAt(dueAtMs: number, position: StampingPosition | null): RetentionStamping | null {
  return position === null ? null : { dueAtMs, cursor: stampingCursor(position) };
}

/**
 * Reads up to `limit` documents of one expiring subcollection after `afterId` (document ID order,
 * which every collection serves without a composite index), reading only their `expireAt`, and
 * stamps in one batch those that do not carry `expireAtMs` yet. The same batch records the job's
 * stamping position after this page and is conditioned on the job's update time as the pass found
 * it: a job written since (a re-drive, a re-run's first step) fails the batch, so no stamp lands
 * on a job that runs again, whatever the pass read before. A batch that fails writes nothing.
 */
export async function stampPage(store: JobCommitHandle, stamping: StampingJob, position: StampingPosition, limit: number, expireAtMs: number): Promise<StampedPage> {
  const { job } = stamping;
  const size = Math.max(1, Math.min(MAX_STAMPS_PER_BATCH, Math.floor(limit)));
  let query = store.jobRef(job.id).collection(position.collection).orderBy(FieldPath.documentId()).select(EXPIRE_AT);
  if (position.afterId !== null) query = query.startAfter(position.afterId);
  const docs: QueryDocumentSnapshot[] = (await query.limit(size).get()).docs;
  const expireAt = Timestamp.fromMillis(expireAtMs);
  const due: DocumentReference[] = docs.filter((doc) => !isTimestamp(doc.get(EXPIRE_AT), expireAt)).map((doc) => doc.ref);
  const next = positionAfter(position, docs.length < size ? null : (docs.at(-1)?.id ?? null));
  if (due.length === 0 || !job.retention) return { read: docs.length, stamped: 0, next, job: stamping };
  const batch = store.db.batch();
  // `update`, not a merge: a document deleted since the read fails the batch instead of coming back as a stub.
  for (const ref of due) batch.update(ref, { [EXPIRE_AT]: expireAt });
  const record = store.commitJob(batch, stamping.version, job, { ...job, retention: stampingAt(job.retention.dueAtMs, next) }, []);
  let results;
  try {
    results = await batch.commit();
  } catch (error) {
    if (isFailedPrecondition(error)) return { read: docs.length, stamped: 0, next, job: null };
    throw error;
  }
  // The job's write is the batch's last (commitJob): its update time conditions the pass's next commit.
  return { read: docs.length, stamped: due.length, next, job: { job: record, version: { ref: stamping.version.ref, updateTime: results.at(-1)?.writeTime } } };
}

function isTimestamp(value: unknown, expected: Timestamp): boolean {
  return value instanceof Timestamp && value.isEqual(expected);
}

/**
 * Records where the job's stamping stands (`retention` set) or that it is done (`retention`
 * null): one commit conditioned on the job's update time as the pass last saw it (read when it
 * began, or written by its last page). False when the job changed since: the pass is then left
 * for the next sweep, which starts again from the stored cursor (stamping is idempotent, so
 * nothing is lost, only some reads repeated).
 */
export async function saveStamping(store: JobCommitHandle, stamping: StampingJob, retention: RetentionStamping | null): Promise<boolean> {
  const batch = store.db.batch();
  store.commitJob(batch, stamping.version, stamping.job, { ...stamping.job, retention }, []);
  try {
    await batch.commit();
    return true;
  } catch (error) {
    if (isFailedPrecondition(error)) return false;
    throw error;
  }
}

/**
 * Takes the retention stamps off a job's expiring documents: for a job that runs again (a re-drive)
 * after the sweeper stamped them, so that TTL does not delete its timeline under the re-run. Paged
 * (one batch per page); a document gone meanwhile (TTL got there first) is skipped. Returns how
 * many stamps were removed. When the job ends again, the sweeper stamps everything afresh.
 */
export async function clearExpiryStamps(store: FirestoreHandle, jobId: string, pageSize = MAX_STAMPS_PER_BATCH): Promise<number> {
  let cleared = 0;
  for (const collection of EXPIRING_JOB_COLLECTIONS) {
    let after: string | null = null;
    for (;;) {
      let query = store.jobRef(jobId).collection(collection).orderBy(FieldPath.documentId()).limit(pageSize);
      if (after !== null) query = query.startAfter(after);
      const page = await query.get();
      const stamped = page.docs.filter((doc) => doc.get(EXPIRE_AT) !== undefined);
      if (stamped.length > 0) {
        const batch = store.db.batch();
        for (const doc of stamped) batch.update(doc.ref, { [EXPIRE_AT]: FieldValue.delete() });
        try {
          await batch.commit();
        } catch {
          // One document gone (expired meanwhile) fails the batch: the rest one by one, the missing skipped.
          await Promise.all(stamped.map((doc) => doc.ref.update({ [EXPIRE_AT]: FieldValue.delete() }).catch(() => undefined)));
        }
        cleared += stamped.length;
      }
      if (page.size < pageSize) break;
      after = page.docs[page.docs.length - 1]?.id ?? null;
    }
  }
  return cleared;
}
