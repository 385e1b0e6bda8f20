/**
 * The effect ledger (store/firestore-ledger.ts) on the store's Firestore instance, for the engine:
 * a claim holder's ledger, the unresolved entries (in a transaction or plainly), and the cancel's update of
 * an in-flight entry.
 */
import { FieldValue, type DocumentData, type DocumentReference, type Transaction } from 'firebase-admin/firestore';
import type { EffectEntry, EffectLedger } from '../core/effect-ledger';
import type { DocumentWrite, ReadVersion } from './door';
import type { FirestoreHandle } from './firestore-handle';
import { effectPath, effectsPath } from './paths';
import { firestoreEffectLedger, unresolvedEffectKeys, type FirestoreLedgerParts } from './firestore-ledger';
import type { JobStore } from './job-store';

/** A claim holder's effect ledger on the store's Firestore. */
export function effectLedgerOf(store: FirestoreHandle, parts: Omit<FirestoreLedgerParts, 'db'>): EffectLedger {
  return firestoreEffectLedger({ db: store.db, ...parts });
}

/** Up to `limit` keys of a job's entries whose outcome is unknown (or in flight), read inside `tx`. */
export function unresolvedEffectsIn(store: FirestoreHandle, tx: Transaction, jobId: string, limit?: number): Promise<string[]> {
  return unresolvedEffectKeys(tx, store.db, jobId, limit);
}

/**
 * The same, read plainly, for the publication's commit conditioned on the job. Every change to a
 * job's entries needs its claim or its end: a holder's goes through the door (a job holder's commit
 * rewrites the job under its precondition, so a claim older than the publishing one is refused and
 * the publication's commit meets any move; a unit holder's is conditioned on its unit and claim
 * slot, which the end of its fan-out revokes), and a stopped job's settling cannot meet a running
 * one's commit (the stop changed the job). The publishing claim itself holds no ledger, and must not: a move under it would change
 * no job and go unfenced. The publication's context refuses effects (test/emulator/publication.test.ts).
 */
export function unresolvedEffectsOf(store: FirestoreHandle, jobId: string, limit?: number): Promise<string[]> {
  return unresolvedEffectKeys(null, store.db, jobId, limit);
}

/** Moves a ledger entry to `state` inside `tx`, counting one more outcome nobody knows (`unknowns + 1`). */
export function markEffectUnknown(tx: Transaction, ref: DocumentReference, change: { readonly state: string; readonly unknownSinceMs: number; readonly unknownBecause: string }): void {
  tx.update(ref, { state: change.state, unknowns: FieldValue.increment(1), unknownSinceMs: change.unknownSinceMs, unknownBecause: change.unknownBecause });
}

/** A ledger entry as read to decide a change from: its raw fields and the version a write deciding from it is conditioned on. */
export interface EffectVersion {
  readonly key: string;
  readonly state: unknown;
  readonly data: DocumentData;
  readonly read: ReadVersion;
}

/** A job's ledger entries (only those in `states`, when given), read plainly, each with its update time: no lock is taken. */
export async function readEffectVersions(store: JobStore, jobId: string, states?: readonly string[]): Promise<EffectVersion[]> {
  const collection = store.db.collection(effectsPath(jobId));
  const snapshot = await (states === undefined ? collection : collection.where('state', 'in', [...states])).get();
  return snapshot.docs.map((doc) => ({ key: doc.id, state: doc.get('state') as unknown, data: doc.data(), read: { path: doc.ref.path, updateTime: doc.updateTime } }));
}

/** The write moving an entry read earlier to `state`, counting one more outcome nobody knows (`unknowns + 1`), conditioned on that read. */
export function effectMarkedUnknown(effect: EffectVersion, change: { readonly state: string; readonly unknownSinceMs: number; readonly unknownBecause: string }): DocumentWrite {
  return { kind: 'update-read', read: effect.read, fields: { state: change.state, unknowns: FieldValue.increment(1), unknownSinceMs: change.unknownSinceMs, unknownBecause: change.unknownBecause } };
}

/** The fence on an entry a change was decided from and leaves as it is: the commit fails if the entry moved since the read. */
export function effectUnchanged(effect: EffectVersion): DocumentWrite {
  return { kind: 'unchanged', read: effect.read, field: 'state', value: effect.state };
}

/** A job's ledger entry by key, read plainly with its update time (null: there is none). */
export async function readEffectVersion(store: JobStore, jobId: string, key: string): Promise<EffectVersion | null> {
  const snapshot = await store.db.doc(effectPath(jobId, key)).get();
  if (!snapshot.exists || !snapshot.updateTime) return null;
  return { key, state: snapshot.get('state') as unknown, data: snapshot.data() ?? {}, read: { path: snapshot.ref.path, updateTime: snapshot.updateTime } };
}

/** The write replacing an entry read earlier by `next` (a field it no longer has is removed), conditioned on that read. */
export function effectReplaced(effect: EffectVersion, next: EffectEntry): DocumentWrite {
  const fields: DocumentData = {};
  for (const key of Object.keys(effect.data)) fields[key] = FieldValue.delete();
  for (const [key, value] of Object.entries(next)) if (value !== undefined) fields[key] = value;
  return { kind: 'update-read', read: effect.read, fields };
}
