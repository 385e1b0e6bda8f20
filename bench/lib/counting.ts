/**
 * Counts what a Firestore client asks of the server, at the RPC layer of one client instance: the
 * documents each `batchGetDocuments` and `runQuery` stream delivers, and the writes in each
 * `commit` that succeeds. Those are the units Firestore bills (a query that returns nothing is
 * billed as one read; that is counted separately). Transactions are counted by wrapping
 * `runTransaction`: every call of the update function is one attempt, so attempts beyond the
 * number of transactions are the retries the SDK made after contention aborted one. Every RPC is
 * also counted as one round trip, and the ones a durable write costs (commits, and the reads and
 * rollbacks of transactions, told apart by the transaction they carry) separately.
 *
 * `request` and `requestStream` are internal methods of @google-cloud/firestore (7.x); the bench
 * replaces them on this one instance only, so the engine's own code runs unchanged.
 */
import type { EventEmitter } from 'node:events';
import type { Firestore } from 'firebase-admin/firestore';

export interface FirestoreCounts {
  /** Documents delivered by document gets and queries. */
  documentsRead: number;
  /** Gets of documents that do not exist (billed as reads). */
  missingReads: number;
  queries: number;
  /** Queries that delivered nothing (Firestore bills one read for each). */
  emptyQueries: number;
  /** Writes in commits that succeeded (a transaction's or a batch's), deletes included. */
  writes: number;
  /** Of those, deletes (billed at the delete price). */
  deletes: number;
  commits: number;
  failedCommits: number;
  /** RPCs that failed with ABORTED (code 10): contention. */
  aborted: number;
  /** runTransaction calls. */
  transactions: number;
  /** Calls of transaction update functions: transactions plus retries. */
  transactionAttempts: number;
  transactionsFailed: number;
  /** Every RPC sent (gets, queries, commits, rollbacks, whatever else), failed ones included: round trips. */
  rpcs: number;
  /** Commits that succeeded with no write in them (a transaction that read and wrote nothing). */
  emptyCommits: number;
  /** Gets and queries sent inside a transaction (they start it or carry its ID). */
  transactionalReads: number;
  /** Rollback RPCs (a transaction's update function threw, or an attempt is retried). */
  rollbacks: number;
  /** beginTransaction RPCs (the SDK 7.x starts a transaction inside its first read instead; counted in case). */
  beginTransactions: number;
}

export interface WriteRecord {
  /** performance.now() when the commit returned. */
  readonly atMs: number;
  /** Document path below `documents/`. */
  readonly path: string;
}

export const emptyCounts = (): FirestoreCounts => ({
  documentsRead: 0,
  missingReads: 0,
  queries: 0,
  emptyQueries: 0,
  writes: 0,
  deletes: 0,
  commits: 0,
  failedCommits: 0,
  aborted: 0,
  transactions: 0,
  transactionAttempts: 0,
  transactionsFailed: 0,
  rpcs: 0,
  emptyCommits: 0,
  transactionalReads: 0,
  rollbacks: 0,
  beginTransactions: 0,
});

/** Reads as Firestore bills them: documents delivered, missing documents, and one per empty query. */
export function billedReads(counts: FirestoreCounts): number {
  return counts.documentsRead + counts.missingReads + counts.emptyQueries;
}

/** Commits that wrote something: the durable writes (one commit may carry several document writes). */
export function durableCommits(counts: FirestoreCounts): number {
  return counts.commits - counts.emptyCommits;
}

/**
 * Round trips spent on durable writes: every commit RPC (failed ones too), and the RPCs a
 * transaction adds to its commit (the reads inside it, rollbacks, a separate beginTransaction).
 * A plain commit, or a transaction that reads nothing, is one; a transaction that reads before it
 * writes is at least two per attempt. Equal to `durableCommits` exactly when every durable write
 * was a single round trip and no transactional round trip was spent without one.
 */
export function writeRoundTrips(counts: FirestoreCounts): number {
  return counts.commits + counts.failedCommits + counts.transactionalReads + counts.rollbacks + counts.beginTransactions;
}

export function subtractCounts(after: FirestoreCounts, before: FirestoreCounts): FirestoreCounts {
  const result = emptyCounts();
  for (const key of Object.keys(result) as (keyof FirestoreCounts)[]) result[key] = after[key] - before[key];
  return result;
}

interface FirestoreInternals {
  request(method: string, request: unknown, tag: string, retryCodes?: unknown): Promise<unknown>;
  requestStream(method: string, bidirectional: boolean, request: unknown, tag: string): Promise<EventEmitter>;
  runTransaction(update: (tx: unknown) => Promise<unknown>, options?: unknown): Promise<unknown>;
}

interface WireRead {
  readonly transaction?: unknown;
  readonly newTransaction?: unknown;
}

interface EmptyQueryWire {
  readonly parent?: string;
  readonly structuredQuery?: { readonly from?: readonly { readonly collectionId?: string }[] };
}

interface WireWrite {
  readonly update?: { readonly name?: string };
  readonly delete?: string;
  readonly transform?: { readonly document?: string };
}

const codeOf = (error: unknown): unknown => (error as { code?: unknown } | null)?.code;

function documentPath(name: string | undefined): string {
  if (name === undefined) return '?';
  const marker = '/documents/';
  const at = name.indexOf(marker);
  return at === -1 ? name : name.slice(at + marker.length);
}

/** A counter attached to one Firestore instance. */
export class FirestoreCounter {
  counts: FirestoreCounts = emptyCounts();
  /** Every committed write with its time, while `recordWrites` is on (the write-rate scenario). */
  readonly writeLog: WriteRecord[] = [];
  /** The document path of every billed read (an empty query: its collection), while `recordWrites` is on. */
  readonly readLog: string[] = [];
  recordWrites = false;

  constructor(readonly db: Firestore) {
    const internals = db as unknown as FirestoreInternals;
    const request = internals.request.bind(db);
    const requestStream = internals.requestStream.bind(db);
    const runTransaction = internals.runTransaction.bind(db);

    internals.request = async (method, body, tag, retryCodes) => {
      this.counts.rpcs += 1;
      if (method === 'rollback') this.counts.rollbacks += 1;
      if (method === 'beginTransaction') this.counts.beginTransactions += 1;
      try {
        const result = await request(method, body, tag, retryCodes);
        if (method === 'commit') {
          const writes = ((body as { writes?: readonly WireWrite[] }).writes ?? []);
          this.counts.commits += 1;
          if (writes.length === 0) this.counts.emptyCommits += 1;
          this.counts.writes += writes.length;
          this.counts.deletes += writes.filter((write) => write.delete !== undefined).length;
          if (this.recordWrites) {
            const atMs = performance.now();
            for (const write of writes) this.writeLog.push({ atMs, path: documentPath(write.update?.name ?? write.delete ?? write.transform?.document) });
          }
        }
        return result;
      } catch (error) {
        if (method === 'commit') this.counts.failedCommits += 1;
        if (codeOf(error) === 10) this.counts.aborted += 1;
        throw error;
      }
    };

    internals.requestStream = async (method, bidirectional, body, tag) => {
      this.counts.rpcs += 1;
      const read = method === 'batchGetDocuments' || method === 'runQuery';
      const wire = body as WireRead | null;
      if (read && (wire?.transaction !== undefined || wire?.newTransaction !== undefined)) this.counts.transactionalReads += 1;
      const stream = await requestStream(method, bidirectional, body, tag);
      if (!read) return stream;
      if (method === 'runQuery') this.counts.queries += 1;
      let delivered = 0;
      const emit = stream.emit.bind(stream);
      // Every chunk a consumer gets passes through emit('data'), whether it iterates or pipes.
      stream.emit = (event: string | symbol, ...args: unknown[]): boolean => {
        if (event === 'data') {
          const chunk = args[0] as { found?: { name?: string }; missing?: string; document?: { name?: string } } | undefined;
          if (chunk?.found || chunk?.document) {
            this.counts.documentsRead += 1;
            delivered += 1;
            if (this.recordWrites) this.readLog.push(documentPath(chunk.found?.name ?? chunk.document?.name));
          } else if (chunk?.missing) {
            this.counts.missingReads += 1;
            delivered += 1;
            if (this.recordWrites) this.readLog.push(documentPath(chunk.missing));
          }
        } else if (event === 'end' && method === 'runQuery' && delivered === 0) {
          this.counts.emptyQueries += 1;
          if (this.recordWrites) this.readLog.push(`${documentPath((body as EmptyQueryWire | null)?.parent)}/${(body as EmptyQueryWire | null)?.structuredQuery?.from?.[0]?.collectionId ?? '?'}`);
        } else if (event === 'error' && codeOf(args[0]) === 10) {
          this.counts.aborted += 1;
        }
        return emit(event, ...args);
      };
      return stream;
    };

    internals.runTransaction = async (update, options) => {
      this.counts.transactions += 1;
      try {
        return await runTransaction((tx) => {
          this.counts.transactionAttempts += 1;
          return update(tx);
        }, options);
      } catch (error) {
        this.counts.transactionsFailed += 1;
        throw error;
      }
    };
  }

  snapshot(): FirestoreCounts {
    return { ...this.counts };
  }

  reset(): void {
    this.counts = emptyCounts();
    this.writeLog.length = 0;
    this.readLog.length = 0;
  }
}
