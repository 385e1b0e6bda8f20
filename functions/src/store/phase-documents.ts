/**
 * A job's stored documents by phase, across its units: the sections of one phase (read whole by the
 * version check on resume), and what an operator's re-drive sets aside (engine/operator.ts).
 *
 * Set aside means moved: each document is copied to `jobs/{id}/setAside/{attempt}~{collection}~{id}`
 * with a `setAside` record (which re-drive, from which phase, by whom, when, where it was), and the
 * original is removed, so that no range or document the engine reads holds it any more (a re-run
 * re-creates sections under the same keys: create-if-absent would otherwise find the old ones). A
 * unit document is not removed but parked without its result: its epoch and step go on counting,
 * so a claim number is never given twice, and its cost stays counted once.
 */
import { FieldPath, type DocumentReference, type DocumentSnapshot, type Query, type Transaction } from 'firebase-admin/firestore';
import type { JobRecord } from '../core/job';
import { setAsideUnit } from '../core/fan-out-moves';
import { decodeUnit } from './codec';
import { prefixSuccessor, type StoredDocument } from './checkpoint-reads';
import { outboxRef } from './job-documents';
import type { JobStore } from './job-store';
import { JOBS } from './paths';

/** Where set-aside documents are kept: a subcollection of their job (owner-readable, like the others; no TTL). */
export const SET_ASIDE = 'setAside';

/** The per-phase collections a re-drive sets aside, in the order it moves them within a phase. */
export const SET_ASIDE_COLLECTIONS = ['checkpoints', 'units', 'sections', 'transcripts', 'drafts'] as const;
export type SetAsideCollection = (typeof SET_ASIDE_COLLECTIONS)[number] | 'outbox';

/** Who set a document aside, and in which attempt. `redrive` numbers the job's re-drives; `epoch` is the job's at the time. */
export interface SetAsideMark {
  readonly redrive: number;
  readonly epoch: number;
  readonly fromPhase: string;
  readonly by: string;
  readonly atMs: number;
}

/** The IDs one re-drive attempt gives what it sets aside start with this: a retried attempt writes the same ones. */
export function setAsidePrefix(mark: Pick<SetAsideMark, 'redrive' | 'epoch'>): string {
  return `r${mark.redrive}e${mark.epoch}~`;
}

export interface SetAsideDocument {
  readonly collection: SetAsideCollection;
  readonly snapshot: DocumentSnapshot;
}

const phaseRange = (store: JobStore, jobId: string, collection: string, phase: string): Query =>
  store.db
    .collection(`${JOBS}/${jobId}/${collection}`)
    .where(FieldPath.documentId(), '>=', `${phase}~`)
    .where(FieldPath.documentId(), '<', prefixSuccessor(`${phase}~`));

/** Every section document of one phase, all units included, as stored. */
export async function readPhaseSectionDocuments(store: JobStore, jobId: string, phase: string): Promise<StoredDocument[]> {
  const snapshot = await phaseRange(store, jobId, 'sections', phase).get();
  return snapshot.docs.map((doc) => ({ id: doc.id, data: doc.data() }));
}

/** A document's size as Firestore will roughly count it: enough to keep a commit well under its 10 MiB. */
function approximateBytes(snapshot: DocumentSnapshot): number {
  return Buffer.byteLength(JSON.stringify(snapshot.data() ?? {})) + snapshot.ref.path.length;
}

export interface SetAsidePage {
  readonly documents: readonly SetAsideDocument[];
  /** True when the page stopped at its bounds: more may be left. */
  readonly full: boolean;
}

/**
 * Reads, in the transaction, the next documents still to set aside for `phases`: the last phase
 * first (an attempt interrupted between pages leaves a job whose later phases are set aside, never
 * a gap before a phase it kept), at most `maxDocuments` and about `maxBytes` (at least one).
 */
export async function readSetAsidePage(store: JobStore, tx: Transaction, jobId: string, phases: readonly string[], maxDocuments: number, maxBytes: number): Promise<SetAsidePage> {
  const documents: SetAsideDocument[] = [];
  let bytes = 0;
  const take = (collection: SetAsideCollection, snapshot: DocumentSnapshot): boolean => {
    const size = approximateBytes(snapshot);
    if (documents.length >= maxDocuments || (documents.length > 0 && bytes + size > maxBytes)) return false;
    documents.push({ collection, snapshot });
    bytes += size;
    return true;
  };
  for (const phase of [...phases].reverse()) {
    for (const collection of SET_ASIDE_COLLECTIONS) {
      const left = maxDocuments - documents.length;
      if (left <= 0) return { documents, full: true };
      const found = collection === 'checkpoints' ? [await tx.get(store.checkpointRef(jobId, phase))].filter((doc) => doc.exists) : (await tx.get(phaseRange(store, jobId, collection, phase).limit(left))).docs;
      for (const snapshot of found) if (!take(collection, snapshot)) return { documents, full: true };
    }
  }
  return { documents, full: false };
}

/** The job's published answer, if there is one (its conversation's message, or `results/final`). */
export async function readOutbox(store: JobStore, tx: Transaction, job: Pick<JobRecord, 'id' | 'conversationId'>): Promise<SetAsideDocument | null> {
  const snapshot = await tx.get(outboxRef(store, job));
  return snapshot.exists ? { collection: 'outbox', snapshot } : null;
}

/** Which phase an earlier, interrupted attempt with these IDs was re-driving from, if it set anything aside. */
export async function readEarlierAttempt(store: JobStore, tx: Transaction, jobId: string, mark: Pick<SetAsideMark, 'redrive' | 'epoch'>): Promise<string | null> {
  const prefix = setAsidePrefix(mark);
  const found = await tx.get(
    store.db.collection(`${JOBS}/${jobId}/${SET_ASIDE}`).where(FieldPath.documentId(), '>=', prefix).where(FieldPath.documentId(), '<', prefixSuccessor(prefix)).limit(1),
  );
  const fromPhase: unknown = found.docs[0]?.get('setAside.fromPhase');
  return typeof fromPhase === 'string' ? fromPhase : null;
}

/** How many documents attempts with these IDs set aside so far (interrupted ones included). */
export async function countSetAside(store: JobStore, tx: Transaction, jobId: string, mark: Pick<SetAsideMark, 'redrive' | 'epoch'>): Promise<number> {
  const prefix = setAsidePrefix(mark);
  const counted = await tx.get(
    store.db.collection(`${JOBS}/${jobId}/${SET_ASIDE}`).where(FieldPath.documentId(), '>=', prefix).where(FieldPath.documentId(), '<', prefixSuccessor(prefix)).count(),
  );
  return counted.data().count;
}

function auditRef(store: JobStore, jobId: string, mark: SetAsideMark, document: SetAsideDocument): DocumentReference {
  return store.db.doc(`${JOBS}/${jobId}/${SET_ASIDE}/${setAsidePrefix(mark)}${document.collection}~${document.snapshot.id}`);
}

/**
 * Moves the documents read (all reads of the transaction come first): a copy under the job's
 * `setAside` with its record, then the original removed, or, for a unit, parked without its result
 * and with fresh budgets (see the module comment). Returns the number of writes added.
 */
export function writeSetAside(store: JobStore, tx: Transaction, jobId: string, mark: SetAsideMark, documents: readonly SetAsideDocument[]): number {
  let writes = 0;
  for (const document of documents) {
    const { snapshot } = document;
    const record = { ...mark, collection: document.collection, id: snapshot.id, path: snapshot.ref.path };
    tx.set(auditRef(store, jobId, mark, document), { ...snapshot.data(), setAside: record });
    if (document.collection === 'units') {
      const unit = decodeUnit(snapshot.ref.path, snapshot.data());
      const message = `Set aside by re-drive ${mark.redrive} (from ${mark.fromPhase}, by ${mark.by}); its result is kept under ${SET_ASIDE}`;
      store.commitUnit(tx, snapshot, setAsideUnit(unit, { message, atMs: mark.atMs }), unit);
      // commitUnit may also revoke the unit's claim slot: counted as a write of its own.
      writes += 3;
    } else {
      tx.delete(snapshot.ref);
      writes += 2;
    }
  }
  return writes;
}
