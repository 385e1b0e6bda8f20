/**
 * Puts another actor's write between a plain read and the commit decided from it: the read's
 * answer is held until `during` has run (once, after the first matching read), so the commit that
 * follows meets what `during` changed. Also: a commit that lands while its answer is lost.
 */
import { WriteBatch, type DocumentReference, type DocumentSnapshot, type Firestore, type ReadOptions, type WriteResult } from 'firebase-admin/firestore';

export interface Interposed {
  /** Puts the real read back. */
  restore(): void;
  /** Whether `during` ran: a test that relies on the interposition checks it happened. */
  ran(): boolean;
}

/** After the first `db.getAll` whose document paths `matches` accepts. */
export function afterFirstGetAll(db: Firestore, matches: (paths: readonly string[]) => boolean, during: () => Promise<unknown>): Interposed {
  const getAll = db.getAll.bind(db);
  let ran = false;
  const spy = jest.spyOn(db, 'getAll').mockImplementation(async (...refs: (DocumentReference | ReadOptions)[]): Promise<DocumentSnapshot[]> => {
    const snapshots = await getAll(...refs);
    if (!ran && matches(refs.map((ref) => ('path' in ref ? ref.path : '')))) {
      ran = true;
      await during();
    }
    return snapshots;
  });
  return { restore: () => spy.mockRestore(), ran: () => ran };
}

/** After every `db.getAll` whose document paths `matches` accepts: each decision meets a change made since its read. */
export function afterEveryGetAll(db: Firestore, matches: (paths: readonly string[]) => boolean, during: () => Promise<unknown>): Interposed & { times(): number } {
  const getAll = db.getAll.bind(db);
  let times = 0;
  const spy = jest.spyOn(db, 'getAll').mockImplementation(async (...refs: (DocumentReference | ReadOptions)[]): Promise<DocumentSnapshot[]> => {
    const snapshots = await getAll(...refs);
    if (matches(refs.map((ref) => ('path' in ref ? ref.path : '')))) {
      times += 1;
      await during();
    }
    return snapshots;
  });
  return { restore: () => spy.mockRestore(), ran: () => times > 0, times: () => times };
}

/** After the first `get()` of the document at `path` (any reference to it). */
export function afterFirstGet(db: Firestore, path: string, during: () => Promise<unknown>): Interposed {
  const prototype = Object.getPrototypeOf(db.doc(path)) as { get: (this: DocumentReference) => Promise<DocumentSnapshot> };
  const get = prototype.get;
  let ran = false;
  const spy = jest.spyOn(prototype, 'get').mockImplementation(async function (this: DocumentReference) {
    const snapshot = await get.call(this);
    if (!ran && this.path === path) {
      ran = true;
      await during();
    }
    return snapshot;
  });
  return { restore: () => spy.mockRestore(), ran: () => ran };
}

/** Before the first `get()` of the document at `path` (any reference to it): the read sees what `during` wrote. */
export function beforeFirstGet(db: Firestore, path: string, during: () => Promise<unknown>): Interposed {
  const prototype = Object.getPrototypeOf(db.doc(path)) as { get: (this: DocumentReference) => Promise<DocumentSnapshot> };
  const get = prototype.get;
  let ran = false;
  const spy = jest.spyOn(prototype, 'get').mockImplementation(async function (this: DocumentReference) {
    if (!ran && this.path === path) {
      ran = true;
      await during();
    }
    return get.call(this);
  });
  return { restore: () => spy.mockRestore(), ran: () => ran };
}

/**
 * The first commit that writes a document `matches` accepts (a batch, or a single document's
 * `set`/`create`/`update`, which commit as a batch of one) lands, and its caller hears an error
 * instead of the answer: the answer lost on its way back (a DEADLINE_EXCEEDED after the commit).
 * Transactions commit by another path and are left alone.
 */
export function answerLostAfterFirstCommit(matches: (paths: readonly string[]) => boolean): Interposed {
  let ran = false;
  const around = aroundCommitsWriting(async (paths, commit) => {
    const results = await commit();
    if (!ran && matches(paths)) {
      ran = true;
      throw Object.assign(new Error('4 DEADLINE_EXCEEDED: the commit landed; its answer was lost'), { code: 4 });
    }
    return results;
  });
  return { restore: () => around.restore(), ran: () => ran };
}

/**
 * Every write batch's commit (a batch, or a single document's `set`/`create`/`update`), with the
 * paths of the documents it writes: `around` gets them and the commit, to run it, hold it, or throw
 * instead (nothing lands then). Transactions commit by another path and are left alone.
 */
export function aroundCommitsWriting(around: (paths: readonly string[], commit: () => Promise<WriteResult[]>) => Promise<WriteResult[]>): Interposed {
  type Write = (this: WriteBatch, ref: DocumentReference, ...rest: unknown[]) => WriteBatch;
  const prototype = WriteBatch.prototype as unknown as { set: Write; create: Write; update: Write; commit: (this: WriteBatch) => Promise<WriteResult[]> };
  const paths = new WeakMap<WriteBatch, string[]>();
  const recording = (write: Write): Write =>
    function (this: WriteBatch, ref, ...rest) {
      paths.set(this, [...(paths.get(this) ?? []), ref.path]);
      return write.call(this, ref, ...rest);
    };
  const { set, create, update, commit } = prototype;
  let ran = false;
  const spies = [
    jest.spyOn(prototype, 'set').mockImplementation(recording(set)),
    jest.spyOn(prototype, 'create').mockImplementation(recording(create)),
    jest.spyOn(prototype, 'update').mockImplementation(recording(update)),
    jest.spyOn(prototype, 'commit').mockImplementation(function (this: WriteBatch) {
      ran = true;
      return around(paths.get(this) ?? [], () => commit.call(this));
    }),
  ];
  return { restore: () => spies.forEach((spy) => spy.mockRestore()), ran: () => ran };
}

/**
 * The same database, with `around` run on every write batch's commit: it gets the commit's number
 * (from 1) and the commit itself, to run before, after or not at all (throwing instead).
 */
export function aroundBatchCommits(db: Firestore, around: (commits: number, commit: () => Promise<WriteResult[]>) => Promise<WriteResult[]>): Firestore {
  let commits = 0;
  return new Proxy(db, {
    get(target, property, receiver) {
      if (property !== 'batch') {
        const value: unknown = Reflect.get(target, property, receiver);
        return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
      }
      return (): WriteBatch => {
        const batch = target.batch();
        const commit = batch.commit.bind(batch);
        batch.commit = () => {
          commits += 1;
          return around(commits, commit);
        };
        return batch;
      };
    },
  });
}

/** Runs `run` with the interposition in place, and puts the real read back after it, however it ends. */
export async function whileInterposed<T>(interposed: Interposed, run: () => Promise<T>): Promise<T> {
  try {
    return await run();
  } finally {
    interposed.restore();
  }
}
