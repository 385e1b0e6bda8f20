import type { Firestore, WriteBatch, WriteResult } from 'firebase-admin/firestore';

/** What a promise rejected with; a test that expected a failure fails when it resolves instead. */
export async function failureOf(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error('expected the call to fail');
}

/** What the client sees when a commit's answer never comes back: gRPC UNAVAILABLE (retried as transient). */
export function answerLost(): Error {
  return Object.assign(new Error('14 UNAVAILABLE: the commit was sent, its answer lost (injected)'), { code: 14 });
}

export interface LostCommitAnswers {
  /** The `nth` batch commit from now (1: the next one) lands, then fails as if its answer were lost. */
  arm(nth?: number): void;
  /** Commits that landed and whose answer was lost so far. */
  lost(): number;
  restore(): void;
}

/**
 * How the writer hears of a commit whose answer was lost:
 *   - `transient`: the UNAVAILABLE itself (what the store's own retry sees when the SDK gives up);
 *   - `sdk-retry`: what the Firestore SDK's own retry of the same request answers. The SDK retries
 *     a Commit that failed with UNAVAILABLE (its gapic config: Commit retries RESOURCE_EXHAUSTED and
 *     UNAVAILABLE), and the same writes sent again meet the commit that landed: a write conditioned
 *     on the update time it replaced fails FAILED_PRECONDITION, a `create` ALREADY_EXISTS, an
 *     unconditioned write lands again. Measured through the chaos soak's proxy (answers dropped
 *     until the commit landed, then the connection reset): the caller of `batch.commit()` heard
 *     `9 FAILED_PRECONDITION` 1.6 s later, never the UNAVAILABLE.
 */
export type LostAnswerHeard = 'transient' | 'sdk-retry';

/** Batch commits of `db` (every Firestore of the process: they share the prototype) whose answer a test can lose once armed. */
export function losingCommitAnswers(db: Firestore, heard: LostAnswerHeard = 'transient'): LostCommitAnswers {
  const prototype = Object.getPrototypeOf(db.batch()) as { commit: (this: WriteBatch) => Promise<WriteResult[]> };
  const commit = prototype.commit;
  let countdown = 0;
  let lost = 0;
  const spy = jest.spyOn(prototype, 'commit').mockImplementation(async function (this: WriteBatch) {
    const results = await commit.call(this);
    if (countdown > 0) {
      countdown -= 1;
      if (countdown === 0) {
        lost += 1;
        if (heard === 'transient') throw answerLost();
        // The SDK sends the same request again: its answer is the caller's.
        return commit.call(this);
      }
    }
    return results;
  });
  return {
    arm: (nth = 1) => {
      countdown = nth;
    },
    lost: () => lost,
    restore: () => spy.mockRestore(),
  };
}

/**
 * Every promise rejection nobody handled while this file's tests run, in order: a save started in
 * the background and never waited for shows up here instead of vanishing.
 */
export function unhandledRejections(): unknown[] {
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);
  beforeAll(() => process.on('unhandledRejection', onUnhandled));
  afterAll(() => process.off('unhandledRejection', onUnhandled));
  return unhandled;
}
