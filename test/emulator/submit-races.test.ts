/**
 * A submit is plain reads and one commit conditioned on the owner's
 * usage. These tests race submits (and operators) against each other on the Firestore emulator,
 * interposing a write between a submit's reads and its commit where a deterministic race is needed.
 */
import { ManualClock } from '../../functions/src/core/clock';
import { resolveEngineOptions } from '../../functions/src/core/options';
import type { QuotaDefaults } from '../../functions/src/core/quota';
import { submitJob } from '../../functions/src/engine/submit';
import { JobStore, jobIdForIdempotencyKey, type NewJob } from '../../functions/src/store/job-store';
import { SubmitQuota, setUserLimits, type Submitter } from '../../functions/src/store/quota-documents';
import { conversationPath, jobPath, quotaUsagePath, userLimitsPath } from '../../functions/src/store/paths';
import { openTestFirestore, type TestFirestore } from '../support/firestore';
import { afterFirstGetAll } from '../support/interpose';
import { RecordingTaskQueue } from '../support/task-queue';

const LIMITS: QuotaDefaults = { signedIn: { jobsInFlight: 1, submitsPerMinute: 50, spendUsdPerDay: 10 }, anonymous: { jobsInFlight: 1, submitsPerMinute: 2, spendUsdPerDay: 1 } };
const ROOMY: QuotaDefaults = { signedIn: { jobsInFlight: 100, submitsPerMinute: 600, spendUsdPerDay: 10 }, anonymous: { jobsInFlight: 1, submitsPerMinute: 2, spendUsdPerDay: 1 } };

let firestore: TestFirestore;
let clock: ManualClock;
let store: JobStore;
let queue: RecordingTaskQueue;
beforeAll(() => {
  firestore = openTestFirestore('submit-races');
  clock = new ManualClock(Date.UTC(2026, 5, 1, 12));
  store = new JobStore(firestore.db, clock, resolveEngineOptions({}));
});
beforeEach(async () => {
  queue = new RecordingTaskQueue();
  await firestore.reset();
});
afterAll(() => firestore.close());

const db = () => firestore.db;
const alice: Submitter = { uid: 'uid-alice', anonymous: false };
const request = (text: string, idempotencyKey: string | null = null, owner = 'uid-alice', conversationId: string | null = null): NewJob => ({
  owner,
  pipeline: 'echo',
  input: { text },
  conversationId,
  idempotencyKey,
});
const deps = (defaults: QuotaDefaults) => ({ store, queue, logger: { warn: () => undefined, error: () => undefined }, quota: new SubmitQuota(db(), defaults) });
const jobsOf = async (uid: string): Promise<number> => (await db().collection('jobs').where('owner', '==', uid).get()).size;
/** Runs `during` once, right after the first `getAll` that reads `path` has read (before its caller goes on). */
const afterFirstRead = (path: string, during: () => Promise<void>) => afterFirstGetAll(db(), (paths) => paths.includes(path), during);
const inFlightOf = async (uid: string): Promise<string[]> => ((await db().doc(quotaUsagePath(uid)).get()).get('inFlightJobIds') as string[] | undefined) ?? [];

describe('the same Idempotency-Key', () => {
  test('a repeat whose first submit lands between its job read and its usage read is accepted as that job, never refused (README: "never refused")', async () => {
    const key = 'msg-1';
    const keyedPath = jobPath(jobIdForIdempotencyKey('uid-alice', key));
    let first: Awaited<ReturnType<typeof submitJob>> | undefined;
    // The repeat reads the job (absent); the first submit then commits, taking the only slot; the repeat's admission reads the usage.
    const interposed = afterFirstRead(keyedPath, async () => {
      first = await submitJob(deps(LIMITS), request('hello', key));
    });
    let repeat;
    try {
      repeat = await submitJob(deps(LIMITS), request('hello', key));
    } finally {
      interposed.restore();
    }
    expect(interposed.ran()).toBe(true);
    expect(first).toMatchObject({ kind: 'accepted', created: true });
    // Promise: same owner and key -> the same job, never a 429.
    expect(repeat).toMatchObject({ kind: 'accepted', created: false, job: { id: jobIdForIdempotencyKey('uid-alice', key) } });
    expect(await jobsOf('uid-alice')).toBe(1);
    expect(queue.tasks).toHaveLength(1);
  });

  test('the same key reused for a different request while its first submit lands: 422 conflict, not a 429', async () => {
    const key = 'msg-2';
    const keyedPath = jobPath(jobIdForIdempotencyKey('uid-alice', key));
    const interposed = afterFirstRead(keyedPath, async () => {
      await submitJob(deps(LIMITS), request('first body', key));
    });
    let other;
    try {
      other = await submitJob(deps(LIMITS), request('another body', key));
    } finally {
      interposed.restore();
    }
    expect(interposed.ran()).toBe(true);
    expect(other).toMatchObject({ kind: 'conflict' });
  });

  test('8 concurrent submits of one key with one free slot, 20 rounds: every one accepted, one job, one created, one task', async () => {
    const refusedRounds: number[] = [];
    for (let round = 0; round < 20; round += 1) {
      await firestore.reset();
      queue = new RecordingTaskQueue();
      const outcomes = await Promise.all(Array.from({ length: 8 }, () => submitJob(deps(LIMITS), request('hello', `parallel-${round}`))));
      if (outcomes.some((outcome) => outcome.kind !== 'accepted')) refusedRounds.push(round);
      expect(outcomes.filter((outcome) => outcome.kind === 'accepted' && outcome.created)).toHaveLength(outcomes.filter((outcome) => outcome.kind === 'accepted').length > 0 ? 1 : 0);
      expect(await jobsOf('uid-alice')).toBe(1);
      expect(queue.tasks).toHaveLength(1);
      expect(await inFlightOf('uid-alice')).toHaveLength(1);
    }
    // Promise: a repeat of an accepted key is never refused.
    expect(refusedRounds).toEqual([]);
  }, 180_000);
});

describe("the operator's limits", () => {
  test("an operator's cut to 0 jobs in flight that completes between a submit's reads and its commit applies to that submit", async () => {
    // The admission reads usage, userLimits and today's spend in one getAll; the operator's cut lands right after it.
    const interposed = afterFirstRead(userLimitsPath('uid-alice'), async () => {
      await setUserLimits(db(), 'uid-alice', { jobsInFlight: 0 }, clock.now());
    });
    let outcome;
    try {
      outcome = await submitJob(deps(ROOMY), request('after the cut'));
    } finally {
      interposed.restore();
    }
    expect(interposed.ran()).toBe(true);
    // setUserLimits returned before the submit committed; the job must not be created under the old limit.
    expect(outcome).toMatchObject({ kind: 'over_limit', refusal: { limit: 'jobs_in_flight', allowed: 0 } });
    expect(await jobsOf('uid-alice')).toBe(0);
  });
});

describe('limits under concurrency', () => {
  test('an anonymous submit whose slot a signed-in submit of the same user took between its reads and its commit is refused', async () => {
    const interposed = afterFirstRead(quotaUsagePath('uid-alice'), async () => {
      const signedIn = await submitJob(deps(LIMITS), request('signed in'), { anonymous: false });
      expect(signedIn).toMatchObject({ kind: 'accepted', created: true });
    });
    let anonymous;
    try {
      anonymous = await submitJob(deps(LIMITS), request('anonymous'), { anonymous: true });
    } finally {
      interposed.restore();
    }
    expect(interposed.ran()).toBe(true);
    expect(anonymous).toMatchObject({ kind: 'over_limit', refusal: { limit: 'jobs_in_flight' } });
    expect(await jobsOf('uid-alice')).toBe(1);
  });

  test('a job ending between a submit\'s usage read and its commit never frees more than one slot: limit 1, 12 parallel submits after it ends', async () => {
    const first = await submitJob(deps(LIMITS), request('first'));
    expect(first).toMatchObject({ kind: 'accepted' });
    const firstId = (first as { job: { id: string } }).job.id;
    const ending = store.jobRef(firstId).update({ status: 'completed' });
    const outcomes = await Promise.all([ending.then(() => null), ...Array.from({ length: 12 }, (_, index) => submitJob(deps(LIMITS), request(`next ${index}`)))]);
    const accepted = outcomes.filter((outcome) => outcome?.kind === 'accepted');
    expect(accepted.length).toBeLessThanOrEqual(1);
    expect((await db().collection('jobs').where('owner', '==', 'uid-alice').where('status', '==', 'queued').get()).size).toBeLessThanOrEqual(1);
    expect(await inFlightOf('uid-alice')).toHaveLength(1);
  });

  test('30 parallel submits of one user within roomy limits (100 in flight, 600 a minute): every one accepted, none fails', async () => {
    const settled = await Promise.allSettled(Array.from({ length: 30 }, (_, index) => submitJob(deps(ROOMY), request(`burst ${index}`))));
    const failures = settled.filter((result) => result.status === 'rejected').map((result) => String((result).reason));
    const accepted = settled.filter((result) => result.status === 'fulfilled' && result.value.kind === 'accepted').length;
    expect({ accepted, failures: failures.slice(0, 2), failed: failures.length }).toEqual({ accepted: 30, failures: [], failed: 0 });
    expect(await jobsOf('uid-alice')).toBe(30);
    expect(await inFlightOf('uid-alice')).toHaveLength(30);
  }, 120_000);
});

describe('conversations', () => {
  test('two users opening the same new conversation at once: exactly one owns it, the other is refused and writes nothing', async () => {
    const settled = await Promise.allSettled([store.createJob(request('alice', null, 'uid-alice', 'chat-x')), store.createJob(request('bob', null, 'uid-bob', 'chat-x'))]);
    const owner = (await db().doc(conversationPath('chat-x')).get()).get('owner') as string;
    expect(['uid-alice', 'uid-bob']).toContain(owner);
    const loser = owner === 'uid-alice' ? 'uid-bob' : 'uid-alice';
    expect(settled.filter((result) => result.status === 'rejected').map((result) => String((result).reason))).toEqual([expect.stringMatching(/belongs to someone else/)]);
    expect(await jobsOf(loser)).toBe(0);
    expect(await jobsOf(owner)).toBe(1);
  });

  test('one user submitting twice at once into a new conversation: both accepted, one record, theirs', async () => {
    const outcomes = await Promise.all([store.createJob(request('one', null, 'uid-alice', 'chat-y')), store.createJob(request('two', null, 'uid-alice', 'chat-y'))]);
    expect(outcomes.every((outcome) => 'created' in outcome && outcome.created)).toBe(true);
    expect((await db().doc(conversationPath('chat-y')).get()).get('owner')).toBe('uid-alice');
    expect(await jobsOf('uid-alice')).toBe(2);
  });
});

test('per-minute window: 12 parallel submits against 4 a minute admit exactly 4', async () => {
  const rate: QuotaDefaults = { ...ROOMY, signedIn: { jobsInFlight: 100, submitsPerMinute: 4, spendUsdPerDay: 10 } };
  const outcomes = await Promise.all(Array.from({ length: 12 }, (_, index) => submitJob(deps(rate), request(`rate ${index}`))));
  expect(outcomes.filter((outcome) => outcome.kind === 'accepted')).toHaveLength(4);
  expect(((await db().doc(quotaUsagePath('uid-alice')).get()).get('recentSubmitsAtMs') as number[]).length).toBe(4);
  expect(alice.uid).toBe('uid-alice');
});
