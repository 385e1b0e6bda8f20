/**
 * firestore.rules on the official emulator: a signed-in user reads their own jobs, the jobs'
 * subcollections and their conversations' messages; every other read is denied, and no client
 * writes anything. Each case is one assertion. The last block loads deliberately loosened copies
 * of the rules and shows that the very checks made here would catch each loosening.
 */
import { assertFails, assertSucceeds, type RulesTestEnvironment } from '@firebase/rules-unit-testing';
import { collection, deleteDoc, doc, getDoc, getDocs, limit, query, setDoc, updateDoc, where, type Firestore } from 'firebase/firestore';
import { as, RULES, rulesSuite, type Loosening } from '../support/rules';

const OWNER = 'alice';
const STRANGER = 'bob';
/** Every subcollection the engine writes under a job. */
const SUBCOLLECTIONS = ['events', 'sections', 'units', 'results', 'effects', 'transcripts', 'checkpoints', 'drafts'] as const;

/** alice's job and conversation, bob's, and the engine's own collections, written with rules off. */
async function seed(env: RulesTestEnvironment): Promise<void> {
  await env.clearFirestore();
  await env.withSecurityRulesDisabled(async (context) => {
    const db = context.firestore() as unknown as Firestore;
    for (const [jobId, owner, conversationId] of [
      ['job-a', OWNER, 'conv-a'],
      ['job-b', STRANGER, 'conv-b'],
    ] as const) {
      await setDoc(doc(db, `jobs/${jobId}`), { owner, pipeline: 'research', status: 'running', conversationId });
      for (const subcollection of SUBCOLLECTIONS) await setDoc(doc(db, `jobs/${jobId}/${subcollection}/d1`), { note: `${subcollection} of ${jobId}` });
      await setDoc(doc(db, `conversations/${conversationId}`), { owner });
      await setDoc(doc(db, `conversations/${conversationId}/messages/${jobId}`), { markdown: `answer to ${jobId}` });
    }
    await setDoc(doc(db, 'circuits/offline'), { open: false });
    await setDoc(doc(db, 'rejectedTasks/t1'), { payload: '{}' });
    await setDoc(doc(db, 'quotaTotals/anonymous'), { inFlightJobIds: ['job-a', 'job-b'], updatedAtMs: 0 });
  });
}

/** The stranger's read of alice's job: the check the loosened-rules tests reuse. */
const strangerReadsJob = (env: RulesTestEnvironment) => getDoc(doc(as(env, STRANGER), 'jobs/job-a'));
const strangerReadsEvents = (env: RulesTestEnvironment) => getDocs(collection(as(env, STRANGER), 'jobs/job-a/events'));
const ownerUpdatesJob = (env: RulesTestEnvironment) => updateDoc(doc(as(env, OWNER), 'jobs/job-a'), { status: 'completed' });

let env: RulesTestEnvironment;
const { catchesLoosening, environment } = rulesSuite('rules', seed, (created) => {
  env = created;
});

describe('the owner reads', () => {
  test('their job', async () => {
    await assertSucceeds(getDoc(doc(as(env, OWNER), 'jobs/job-a')));
  });

  test.each(SUBCOLLECTIONS)('a document of their job\'s %s', async (subcollection) => {
    await assertSucceeds(getDoc(doc(as(env, OWNER), `jobs/job-a/${subcollection}/d1`)));
  });

  test.each(SUBCOLLECTIONS)('their job\'s %s as a list', async (subcollection) => {
    const listed = await assertSucceeds(getDocs(collection(as(env, OWNER), `jobs/job-a/${subcollection}`)));
    expect(listed.size).toBe(1);
  });

  test('their jobs, listed with where(owner == uid)', async () => {
    const listed = await assertSucceeds(getDocs(query(collection(as(env, OWNER), 'jobs'), where('owner', '==', OWNER))));
    expect(listed.docs.map((snapshot) => snapshot.id)).toEqual(['job-a']);
  });

  test('their conversation', async () => {
    await assertSucceeds(getDoc(doc(as(env, OWNER), 'conversations/conv-a')));
  });

  test('a message of their conversation', async () => {
    await assertSucceeds(getDoc(doc(as(env, OWNER), 'conversations/conv-a/messages/job-a')));
  });

  test('their conversation\'s messages as a list', async () => {
    await assertSucceeds(getDocs(collection(as(env, OWNER), 'conversations/conv-a/messages')));
  });
});

describe('every other read is denied', () => {
  test('another user\'s job', async () => {
    await assertFails(strangerReadsJob(env));
  });

  test.each(SUBCOLLECTIONS)('a document of another user\'s job\'s %s', async (subcollection) => {
    await assertFails(getDoc(doc(as(env, STRANGER), `jobs/job-a/${subcollection}/d1`)));
  });

  test.each(SUBCOLLECTIONS)('another user\'s job\'s %s as a list', async (subcollection) => {
    await assertFails(getDocs(collection(as(env, STRANGER), `jobs/job-a/${subcollection}`)));
  });

  test('a job, unauthenticated', async () => {
    await assertFails(getDoc(doc(as(env, null), 'jobs/job-a')));
  });

  test.each(SUBCOLLECTIONS)('a document of a job\'s %s, unauthenticated', async (subcollection) => {
    await assertFails(getDoc(doc(as(env, null), `jobs/job-a/${subcollection}/d1`)));
  });

  test('a job that does not exist', async () => {
    await assertFails(getDoc(doc(as(env, OWNER), 'jobs/no-such-job')));
  });

  test('the subcollection of a job that does not exist', async () => {
    await assertFails(getDocs(collection(as(env, OWNER), 'jobs/no-such-job/events')));
  });

  test('all jobs as a list, without an owner filter', async () => {
    await assertFails(getDocs(collection(as(env, OWNER), 'jobs')));
  });

  test('all jobs as a limited list, without an owner filter', async () => {
    await assertFails(getDocs(query(collection(as(env, OWNER), 'jobs'), limit(1))));
  });

  test('another user\'s jobs, listed with where(owner == their uid)', async () => {
    await assertFails(getDocs(query(collection(as(env, OWNER), 'jobs'), where('owner', '==', STRANGER))));
  });

  test('jobs listed with an owner filter, unauthenticated', async () => {
    await assertFails(getDocs(query(collection(as(env, null), 'jobs'), where('owner', '==', OWNER))));
  });

  test('another user\'s conversation', async () => {
    await assertFails(getDoc(doc(as(env, STRANGER), 'conversations/conv-a')));
  });

  test('a message of another user\'s conversation', async () => {
    await assertFails(getDoc(doc(as(env, STRANGER), 'conversations/conv-a/messages/job-a')));
  });

  test('another user\'s conversation\'s messages as a list', async () => {
    await assertFails(getDocs(collection(as(env, STRANGER), 'conversations/conv-a/messages')));
  });

  test('a message, unauthenticated', async () => {
    await assertFails(getDoc(doc(as(env, null), 'conversations/conv-a/messages/job-a')));
  });

  test('a provider circuit (circuits/*)', async () => {
    await assertFails(getDoc(doc(as(env, OWNER), 'circuits/offline')));
  });

  test('the circuits as a list', async () => {
    await assertFails(getDocs(collection(as(env, OWNER), 'circuits')));
  });

  test('a rejected task (rejectedTasks/*)', async () => {
    await assertFails(getDoc(doc(as(env, OWNER), 'rejectedTasks/t1')));
  });

  test('the rejected tasks as a list', async () => {
    await assertFails(getDocs(collection(as(env, OWNER), 'rejectedTasks')));
  });

  test("the anonymous accounts' jobs in flight (quotaTotals/*): other users' job IDs", async () => {
    await assertFails(getDoc(doc(as(env, OWNER), 'quotaTotals/anonymous')));
  });
});

describe('no client writes anything, not even the owner', () => {
  test('creating a job', async () => {
    await assertFails(setDoc(doc(as(env, OWNER), 'jobs/job-new'), { owner: OWNER, pipeline: 'research', status: 'queued' }));
  });

  test('updating their job', async () => {
    await assertFails(ownerUpdatesJob(env));
  });

  test('overwriting their job', async () => {
    await assertFails(setDoc(doc(as(env, OWNER), 'jobs/job-a'), { owner: OWNER, pipeline: 'research', status: 'completed' }));
  });

  test('deleting their job', async () => {
    await assertFails(deleteDoc(doc(as(env, OWNER), 'jobs/job-a')));
  });

  test.each(SUBCOLLECTIONS)('creating a document in their job\'s %s', async (subcollection) => {
    await assertFails(setDoc(doc(as(env, OWNER), `jobs/job-a/${subcollection}/new`), { note: 'forged' }));
  });

  test.each(SUBCOLLECTIONS)('updating a document of their job\'s %s', async (subcollection) => {
    await assertFails(updateDoc(doc(as(env, OWNER), `jobs/job-a/${subcollection}/d1`), { note: 'forged' }));
  });

  test.each(SUBCOLLECTIONS)('deleting a document of their job\'s %s', async (subcollection) => {
    await assertFails(deleteDoc(doc(as(env, OWNER), `jobs/job-a/${subcollection}/d1`)));
  });

  test('creating a conversation', async () => {
    await assertFails(setDoc(doc(as(env, OWNER), 'conversations/conv-new'), { owner: OWNER }));
  });

  test('updating their conversation', async () => {
    await assertFails(updateDoc(doc(as(env, OWNER), 'conversations/conv-a'), { owner: STRANGER }));
  });

  test('deleting their conversation', async () => {
    await assertFails(deleteDoc(doc(as(env, OWNER), 'conversations/conv-a')));
  });

  test('creating a message in their conversation', async () => {
    await assertFails(setDoc(doc(as(env, OWNER), 'conversations/conv-a/messages/new'), { markdown: 'forged' }));
  });

  test('updating a message of their conversation', async () => {
    await assertFails(updateDoc(doc(as(env, OWNER), 'conversations/conv-a/messages/job-a'), { markdown: 'forged' }));
  });

  test('deleting a message of their conversation', async () => {
    await assertFails(deleteDoc(doc(as(env, OWNER), 'conversations/conv-a/messages/job-a')));
  });

  test('writing a provider circuit', async () => {
    await assertFails(setDoc(doc(as(env, OWNER), 'circuits/offline'), { open: true }));
  });

  test('writing a rejected task', async () => {
    await assertFails(setDoc(doc(as(env, OWNER), 'rejectedTasks/t2'), { payload: '{}' }));
  });

  test('creating a job, unauthenticated', async () => {
    await assertFails(setDoc(doc(as(env, null), 'jobs/job-anon'), { owner: 'anyone', pipeline: 'research', status: 'queued' }));
  });
});

/**
 * Each loosening is applied to a copy of the real rules (the replaced text must be in them, so a
 * rewrite of firestore.rules cannot silently turn these into no-ops), loaded into an environment
 * of its own. The probe is the exact call an assertion above makes, and `assertFails` on it now
 * rejects: that assertion would fail against the loosened rules.
 */
describe('a loosened rule makes the checks above fail', () => {
  const loosenings: readonly Loosening[] = [
    {
      label: 'rules-loose-job',
      what: 'the owner check removed from job reads: a stranger reads the job',
      from: 'allow read: if request.auth != null && resource.data.owner == request.auth.uid;',
      to: 'allow read: if request.auth != null;',
      probe: strangerReadsJob,
    },
    {
      label: 'rules-loose-sub',
      what: 'the owner check removed from subcollection reads: a stranger lists the job\'s events',
      from: 'get(/databases/$(database)/documents/jobs/$(jobId)).data.owner == request.auth.uid',
      to: 'true',
      probe: strangerReadsEvents,
    },
    {
      label: 'rules-loose-write',
      what: 'owners allowed to write their job: the owner rewrites its status',
      from: 'match /jobs/{jobId} {',
      to: 'match /jobs/{jobId} {\n      allow update: if request.auth != null && resource.data.owner == request.auth.uid;',
      probe: ownerUpdatesJob,
    },
  ];

  test.each(loosenings)('$what', (loosening) => catchesLoosening(loosening));
});

describe("a user's limits (userLimits/{uid}) and quota usage (quotaUsage/{uid})", () => {
  const QUOTA_DOCUMENTS = ['userLimits', 'quotaUsage'] as const;
  beforeEach(() =>
    env.withSecurityRulesDisabled(async (context) => {
      const db = context.firestore() as unknown as Firestore;
      for (const uid of [OWNER, STRANGER]) {
        await setDoc(doc(db, `userLimits/${uid}`), { jobsInFlight: 5 });
        await setDoc(doc(db, `quotaUsage/${uid}`), { inFlightJobIds: [], recentSubmitsAtMs: [], updatedAtMs: 0 });
      }
    }),
  );
  const ownerRaisesOwnLimit = (on: RulesTestEnvironment) => setDoc(doc(as(on, OWNER), `userLimits/${OWNER}`), { jobsInFlight: 100 });

  test.each(QUOTA_DOCUMENTS)('the user reads their own %s', async (collectionName) => {
    await assertSucceeds(getDoc(doc(as(env, OWNER), `${collectionName}/${OWNER}`)));
  });

  test.each(QUOTA_DOCUMENTS)("another user's %s is denied", async (collectionName) => {
    await assertFails(getDoc(doc(as(env, STRANGER), `${collectionName}/${OWNER}`)));
  });

  test.each(QUOTA_DOCUMENTS)('%s unauthenticated is denied', async (collectionName) => {
    await assertFails(getDoc(doc(as(env, null), `${collectionName}/${OWNER}`)));
  });

  test.each(QUOTA_DOCUMENTS)('%s as a list is denied', async (collectionName) => {
    await assertFails(getDocs(collection(as(env, OWNER), collectionName)));
  });

  test.each(QUOTA_DOCUMENTS)('the user cannot write their own %s: create, update or delete', async (collectionName) => {
    const own = doc(as(env, OWNER), `${collectionName}/${OWNER}`);
    await assertFails(setDoc(own, { jobsInFlight: 100, inFlightJobIds: [], recentSubmitsAtMs: [] }));
    await assertFails(updateDoc(own, { jobsInFlight: 100, inFlightJobIds: [] }));
    await assertFails(deleteDoc(own));
    await assertFails(setDoc(doc(as(env, OWNER), `${collectionName}/someone-new`), { jobsInFlight: 100 }));
  });

  test('a loosened rule (the owner may write their limits) makes the write check fail', async () => {
    const from = 'match /userLimits/{uid} {';
    expect(RULES).toContain(from);
    const loose = await environment('rules-loose-limits', RULES.replace(from, `${from}\n      allow write: if request.auth != null && request.auth.uid == uid;`));
    await seed(loose);
    await assertSucceeds(ownerRaisesOwnLimit(loose));
    await assertFails(ownerRaisesOwnLimit(env));
  });
});

describe("a job's artifacts (artifacts/{sha256}, artifactChunks/{sha256}~{n}) stay with the functions", () => {
  const ARTIFACT_COLLECTIONS = ['artifacts', 'artifactChunks'] as const;
  beforeEach(() =>
    env.withSecurityRulesDisabled(async (context) => {
      const db = context.firestore() as unknown as Firestore;
      await setDoc(doc(db, 'jobs/job-a/artifacts/d1'), { sha256: 'd1', size: 3, contentType: 'text/plain', chunkCount: 1, chunkBytes: 524288, createdAtMs: 0 });
      await setDoc(doc(db, 'jobs/job-a/artifactChunks/d1'), { sha256: 'd1', index: 0, bytes: 'abc' });
    }),
  );
  const ownerReadsArtifact = (on: RulesTestEnvironment) => getDoc(doc(as(on, OWNER), 'jobs/job-a/artifacts/d1'));

  test.each(ARTIFACT_COLLECTIONS)("the job's owner cannot read a document of its %s", async (collectionName) => {
    await assertFails(getDoc(doc(as(env, OWNER), `jobs/job-a/${collectionName}/d1`)));
  });

  test.each(ARTIFACT_COLLECTIONS)("the job's owner cannot list its %s", async (collectionName) => {
    await assertFails(getDocs(collection(as(env, OWNER), `jobs/job-a/${collectionName}`)));
  });

  test.each(ARTIFACT_COLLECTIONS)('a stranger or a signed-out client cannot read %s', async (collectionName) => {
    await assertFails(getDoc(doc(as(env, STRANGER), `jobs/job-a/${collectionName}/d1`)));
    await assertFails(getDoc(doc(as(env, null), `jobs/job-a/${collectionName}/d1`)));
  });

  test.each(ARTIFACT_COLLECTIONS)("the job's owner cannot write its %s: create, update or delete", async (collectionName) => {
    await assertFails(setDoc(doc(as(env, OWNER), `jobs/job-a/${collectionName}/new`), { sha256: 'new', size: 0 }));
    await assertFails(updateDoc(doc(as(env, OWNER), `jobs/job-a/${collectionName}/d1`), { size: 4 }));
    await assertFails(deleteDoc(doc(as(env, OWNER), `jobs/job-a/${collectionName}/d1`)));
  });

  test('a loosened rule (the artifact exclusion removed) makes the read check fail', async () => {
    const from = "&& !(subcollection in ['artifacts', 'artifactChunks'])";
    expect(RULES).toContain(from);
    const loose = await environment('rules-loose-artifacts', RULES.replace(from, ''));
    await seed(loose);
    await loose.withSecurityRulesDisabled((context) => setDoc(doc(context.firestore() as unknown as Firestore, 'jobs/job-a/artifacts/d1'), { sha256: 'd1', size: 3 }));
    await assertSucceeds(ownerReadsArtifact(loose));
    await assertFails(ownerReadsArtifact(env));
  });
});
