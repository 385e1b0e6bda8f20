/**
 * The reads of a job's semantic state: its phase checkpoints, the sections a phase recorded and the
 * units of a fan-out. Raw documents only; engine/checkpoints.ts validates them against the pipeline.
 */
import { FieldPath, type QueryDocumentSnapshot, type Transaction } from 'firebase-admin/firestore';
import type { FirestoreHandle } from './firestore-handle';
import { JOBS, sectionKey, sectionKeyPrefix, unitsPath } from './paths';

export interface StoredDocument {
  readonly id: string;
  readonly data: unknown;
}

/** Every checkpoint document of a job (one per phase), as stored. */
export async function readCheckpointDocuments(store: FirestoreHandle, jobId: string): Promise<StoredDocument[]> {
  const snapshot = await store.db.collection(`${JOBS}/${jobId}/checkpoints`).get();
  return snapshot.docs.map((doc) => ({ id: doc.id, data: doc.data() }));
}

/** The section documents of one phase and unit, as stored. */
export async function readSectionDocuments(store: FirestoreHandle, jobId: string, phase: string, unit: string | null): Promise<StoredDocument[]> {
  return readByKeyPrefix(store, `${JOBS}/${jobId}/sections`, sectionKeyPrefix(phase, unit));
}

/** The transcripts one phase and unit saved, as stored: read once per step, not once per section. */
export async function readTranscriptDocuments(store: FirestoreHandle, jobId: string, phase: string, unit: string | null): Promise<StoredDocument[]> {
  return readByKeyPrefix(store, `${JOBS}/${jobId}/transcripts`, sectionKeyPrefix(phase, unit));
}

/**
 * One section's transcript documents: its log's saves (`{key}~{save}`) and a whole-transcript
 * document from before the log (`{key}`). The range may hold another section's documents whose
 * key goes on past this one's; the caller groups by the `id` field.
 */
export async function readSectionTranscriptDocuments(store: FirestoreHandle, jobId: string, phase: string, unit: string | null, sectionId: string): Promise<StoredDocument[]> {
  const key = sectionKey(phase, unit, sectionId);
  const snapshot = await store.db.collection(`${JOBS}/${jobId}/transcripts`).where(FieldPath.documentId(), '>=', key).where(FieldPath.documentId(), '<', prefixSuccessor(`${key}~`)).get();
  return snapshot.docs.map((doc) => ({ id: doc.id, data: doc.data() }));
}

/**
 * Documents whose IDs start with `prefix`: a range on document IDs, which needs no index and reads
 * nothing outside it. The range ends at the prefix's successor (its last character plus one), not
 * at prefix + U+F8FF: IDs compare as UTF-8 bytes, and an ID going on with an emoji or a full-width
 * letter sorts above U+F8FF.
 */
async function readByKeyPrefix(store: FirestoreHandle, collection: string, prefix: string): Promise<StoredDocument[]> {
  const snapshot = await store.db.collection(collection).where(FieldPath.documentId(), '>=', prefix).where(FieldPath.documentId(), '<', prefixSuccessor(prefix)).get();
  return snapshot.docs.map((doc) => ({ id: doc.id, data: doc.data() }));
}

/** The least string above every string that starts with `prefix` (section key prefixes end in `~`, so no carry is needed). */
export function prefixSuccessor(prefix: string): string {
  const last = prefix.charCodeAt(prefix.length - 1);
  if (prefix.length === 0 || last >= 0xd800) throw new Error(`no simple successor for key prefix ${JSON.stringify(prefix)}`);
  return prefix.slice(0, -1) + String.fromCharCode(last + 1);
}

/** The unit documents of one fan-out epoch of a job: read in `tx` when given, else outside any transaction. */
export async function readFanOutUnits(store: FirestoreHandle, jobId: string, fanoutEpoch: number, tx?: Transaction): Promise<QueryDocumentSnapshot[]> {
  const query = store.db.collection(unitsPath(jobId)).where('fanoutEpoch', '==', fanoutEpoch);
  return (await (tx ? tx.get(query) : query.get())).docs;
}
