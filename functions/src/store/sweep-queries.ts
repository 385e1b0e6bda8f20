/**
 * The sweeper's queries on Firestore. Their shapes are declared as data in
 * engine/indexed-queries.ts (and checked against firestore.indexes.json by a unit test); this file
 * builds and runs one page of such a shape, so the engine's sweeps reach Firestore only through here.
 */
import { FieldPath, Timestamp, type DocumentReference, type Query, type QueryDocumentSnapshot } from 'firebase-admin/firestore';
import type { FirestoreHandle } from './firestore-handle';

export type QueryScope = 'COLLECTION' | 'COLLECTION_GROUP';

export interface QueryShape {
  /** The collection ID (for a collection group, the ID every collection in the group has). */
  readonly collection: string;
  readonly scope: QueryScope;
  /** Equality filters, with the values the sweeper uses. */
  readonly equals: Readonly<Record<string, string>>;
  /** The range (`<=`) and ordering field. */
  readonly range: string;
}

/** Where the previous page ended: the last document's range value and reference. */
export interface PageCursor {
  readonly value: Timestamp;
  readonly ref: DocumentReference;
}

export interface SweepPage {
  readonly docs: QueryDocumentSnapshot[];
  /** Where the next page starts, or null when this page was the last (short, or its last range value is not a timestamp). */
  readonly next: PageCursor | null;
}

/** Builds one page of a declared query: documents with `range <= upTo`, oldest first. */
function sweepQuery(store: FirestoreHandle, shape: QueryShape, upTo: Timestamp, limit: number, after: PageCursor | null): Query {
  let query: Query = shape.scope === 'COLLECTION' ? store.db.collection(shape.collection) : store.db.collectionGroup(shape.collection);
  for (const [field, value] of Object.entries(shape.equals)) query = query.where(field, '==', value);
  query = query.where(shape.range, '<=', upTo).orderBy(shape.range, 'asc').orderBy(FieldPath.documentId(), 'asc');
  if (after) query = query.startAfter(after.value, after.ref);
  return query.limit(limit);
}

/** Reads one page of `shape` up to `upToMs` (inclusive), `limit` documents at most, after `after`. */
export async function readSweepPage(store: FirestoreHandle, shape: QueryShape, upToMs: number, limit: number, after: PageCursor | null): Promise<SweepPage> {
  const docs = (await sweepQuery(store, shape, Timestamp.fromMillis(upToMs), limit, after).get()).docs;
  const last = docs.at(-1);
  if (!last || docs.length < limit) return { docs, next: null };
  const value: unknown = last.get(shape.range);
  // Not a timestamp cannot happen: the query matched a timestamp range.
  return { docs, next: value instanceof Timestamp ? { value, ref: last.ref } : null };
}

/** A timestamp field of a document found by a sweep query, in milliseconds; null when it is not a timestamp. */
export function timestampMillis(doc: QueryDocumentSnapshot, field: string): number | null {
  const value: unknown = doc.get(field);
  return value instanceof Timestamp ? value.toMillis() : null;
}
