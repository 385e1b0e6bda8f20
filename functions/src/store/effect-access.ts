/**
 * The effect ledger (store/firestore-ledger.ts) on the store's Firestore instance, for the engine:
 * a claim holder's ledger, the unresolved entries (in a transaction or plainly), and the cancel's update of
 * an in-flight entry.
 */
import { FieldValue, type DocumentReference, type Transaction } from 'firebase-admin/firestore';
import type { EffectLedger } from '../core/effect-ledger';
import type { FirestoreHandle } from './firestore-handle';
import { firestoreEffectLedger, unresolvedEffectKeys, type FirestoreLedgerParts } from './firestore-ledger';

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
 * job's entries is a transaction that reads the job and needs its claim or its end: a claim older
 * than the publishing one is refused there (the job's epoch moved on), a unit's once its fan-out
 * is over, and a stopped job's settling cannot meet a running one's commit (the stop changed the
 * job). The publishing claim itself holds no ledger, and must not: a move under it would change
 * no job and go unfenced. The publication's context refuses effects (publication-races.test.ts).
 */
export function unresolvedEffectsOf(store: FirestoreHandle, jobId: string, limit?: number): Promise<string[]> {
  return unresolvedEffectKeys(null, store.db, jobId, limit);
}

/** Moves a ledger entry to `state` inside `tx`, counting one more outcome nobody knows (`unknowns + 1`). */
export function markEffectUnknown(tx: Transaction, ref: DocumentReference, change: { readonly state: string; readonly unknownSinceMs: number; readonly unknownBecause: string }): void {
  tx.update(ref, { state: change.state, unknowns: FieldValue.increment(1), unknownSinceMs: change.unknownSinceMs, unknownBecause: change.unknownBecause });
}
