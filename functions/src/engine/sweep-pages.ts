/**
 * One page of a declared sweep query (engine/indexed-queries.ts) for the engine's passes over
 * Firestore: a query that fails to read is counted and logged, and the pass leaves that query until
 * its next run (the documents it would have found are still there then).
 */
import { describeError } from '../core/errors';
import type { FirestoreHandle } from '../store/firestore-handle';
import { readSweepPage, type PageCursor, type SweepPage } from '../store/sweep-queries';
import { SWEEP_QUERIES, type SweepQueryName } from './indexed-queries';

/** Where a pass counts and logs a failed query read. */
export interface PassFailures {
  readonly counts: { errors: number };
  readonly log: (message: string, detail?: Record<string, unknown>) => void;
  /** The pass's log line for a failed read: "retention: query failed". */
  readonly message: string;
}

/** The page of `name` up to `upToMs` after `after`, or null when the read failed (counted and logged). */
export async function readPassPage(store: FirestoreHandle, name: SweepQueryName, upToMs: number, limit: number, after: PageCursor | null, failures: PassFailures): Promise<SweepPage | null> {
  try {
    return await readSweepPage(store, SWEEP_QUERIES[name], upToMs, limit, after);
  } catch (error) {
    failures.counts.errors += 1;
    failures.log(failures.message, { query: name, error: describeError(error) });
    return null;
  }
}
