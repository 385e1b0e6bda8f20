/**
 * A submit reads plainly and makes one commit: the job, its first event, its conversation's record
 * and the owner's usage, the usage conditioned on the version the admission read. No transaction
 * locks the user's usage document; a submit whose reads went stale decides again.
 */
import { ManualClock } from '../../functions/src/core/clock';
import { resolveEngineOptions } from '../../functions/src/core/options';
import type { QuotaDefaults } from '../../functions/src/core/quota';
import { JobStore } from '../../functions/src/store/job-store';
import { SubmitQuota } from '../../functions/src/store/quota-documents';
import { ANONYMOUS_TOTAL_PATH, conversationPath, quotaUsagePath } from '../../functions/src/store/paths';
import { openTestFirestore, type TestFirestore } from '../support/firestore';
import { afterFirstGetAll } from '../support/interpose';

const LIMITS: QuotaDefaults = { signedIn: { jobsInFlight: 3, submitsPerMinute: 50, spendUsdPerDay: 10 }, anonymous: { jobsInFlight: 1, submitsPerMinute: 2, spendUsdPerDay: 1 } };

let firestore: TestFirestore;
let store: JobStore;
let quota: SubmitQuota;
beforeAll(() => {
  firestore = openTestFirestore('submit-commits');
  store = new JobStore(firestore.db, new ManualClock(), resolveEngineOptions({}));
  quota = new SubmitQuota(firestore.db, LIMITS);
});
beforeEach(() => firestore.reset());
afterAll(() => firestore.close());

const db = () => firestore.db;
const request = (owner: string, text: string, conversationId: string | null = null) => ({ owner, pipeline: 'echo', input: { text }, conversationId, idempotencyKey: null });

test('a submit with its admission makes no transaction', async () => {
  const transactions = jest.spyOn(db(), 'runTransaction');
  try {
    const created = await store.createJob(request('uid-alice', 'one'), quota.admission({ uid: 'uid-alice', anonymous: false }));
    expect('created' in created && created.created).toBe(true);
    expect(transactions).not.toHaveBeenCalled();
  } finally {
    transactions.mockRestore();
  }
  expect((await db().doc(quotaUsagePath('uid-alice')).get()).get('inFlightJobIds')).toHaveLength(1);
});

test("a submit admitted on a usage read that another submit then changed decides again: the user's limit holds", async () => {
  await store.createJob(request('uid-alice', 'one'), quota.admission({ uid: 'uid-alice', anonymous: false }));
  await store.createJob(request('uid-alice', 'two'), quota.admission({ uid: 'uid-alice', anonymous: false }));
  // Two in flight, limit three: both of these read room for one more; the second lands between the first's read and its commit.
  const interposed = afterFirstGetAll(db(), (paths) => paths.includes(quotaUsagePath('uid-alice')), async () => {
    const other = await store.createJob(request('uid-alice', 'three'), quota.admission({ uid: 'uid-alice', anonymous: false }));
    expect('created' in other && other.created).toBe(true);
  });
  let late;
  try {
    late = await store.createJob(request('uid-alice', 'four'), quota.admission({ uid: 'uid-alice', anonymous: false }));
  } finally {
    interposed.restore();
  }
  expect(interposed.ran()).toBe(true);
  expect(late).toMatchObject({ refused: { limit: 'jobs_in_flight' } });
  expect((await db().doc(quotaUsagePath('uid-alice')).get()).get('inFlightJobIds')).toHaveLength(3);
  expect((await db().collection('jobs').where('owner', '==', 'uid-alice').get()).size).toBe(3);
});

test('bug 29: an anonymous submit admitted on a ceiling another anonymous account then filled decides again: the ceiling holds', async () => {
  const ceilingOfTwo = new SubmitQuota(db(), { ...LIMITS, anonymousJobsInFlightTotal: 2 });
  const anonymous = (uid: string) => ceilingOfTwo.admission({ uid, anonymous: true });
  await store.createJob(request('uid-first', 'one'), anonymous('uid-first'));
  // One in flight, ceiling two: the late submit reads room for one more; another account's submit takes it before the late one commits.
  const interposed = afterFirstGetAll(db(), (paths) => paths.includes(ANONYMOUS_TOTAL_PATH), async () => {
    expect(await store.createJob(request('uid-other', 'two'), anonymous('uid-other'))).toMatchObject({ created: true });
  });
  let late;
  try {
    late = await store.createJob(request('uid-late', 'three'), anonymous('uid-late'));
  } finally {
    interposed.restore();
  }
  expect(interposed.ran()).toBe(true);
  expect(late).toMatchObject({ refused: { limit: 'anonymous_jobs_in_flight', allowed: 2 } });
  expect((await db().doc(ANONYMOUS_TOTAL_PATH).get()).get('inFlightJobIds')).toHaveLength(2);
  expect((await db().collection('jobs').get()).size).toBe(2);
});

test("a conversation another user opened between a submit's read and its commit stays theirs: the submit is refused", async () => {
  const interposed = afterFirstGetAll(db(), (paths) => paths.includes(conversationPath('chat-9')), async () => {
    await store.createJob(request('uid-bob', 'first in', 'chat-9'));
  });
  let refusal: unknown = null;
  try {
    await store.createJob(request('uid-alice', 'second', 'chat-9')).catch((error: unknown) => {
      refusal = error;
    });
  } finally {
    interposed.restore();
  }
  expect(interposed.ran()).toBe(true);
  expect(String(refusal)).toMatch(/belongs to someone else/);
  expect((await db().doc(conversationPath('chat-9')).get()).get('owner')).toBe('uid-bob');
  expect((await db().collection('jobs').where('owner', '==', 'uid-alice').get()).size).toBe(0);
});
