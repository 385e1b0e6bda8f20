/**
 * The frontend client (client/) against the stack this layer runs under, as a custom chat UI would
 * use it: the Firebase web SDK in Node, signed in anonymously on the Auth emulator and reading
 * Firestore under the project's security rules; the HTTP calls go to the functions emulator, whose
 * phases run as Cloud Tasks. Submitting twice with one key (once through a lost answer) makes one
 * job, watched to its published answer; a waiting job's question is answered and the job finishes;
 * a queued job is cancelled.
 *
 * The waiting and the queued job are prepared with the engine's own store (the admin SDK), as the
 * engine would leave them: no deployed pipeline asks a person a question by itself, and a job the
 * functions run would race the cancel (test/e2e/browser.test.ts does the same for the page).
 */
import { randomUUID } from 'node:crypto';
import { deleteApp as deleteAdminApp, initializeApp as initializeAdminApp, type App } from 'firebase-admin/app';
import { getFirestore as adminFirestore, type Firestore as AdminFirestore } from 'firebase-admin/firestore';
import { deleteApp, initializeApp, type FirebaseApp } from 'firebase/app';
import { terminate, type Firestore } from 'firebase/firestore';
import {
  connectFirebase,
  createPhaselineClient,
  idTokenOf,
  PhaselineApiError,
  signedInUser,
  type FetchLike,
  type JobSnapshot,
  type PhaselineClient,
} from '../../client';
import { systemClock } from '../../functions/src/core/clock';
import type { JobRecord } from '../../functions/src/core/job';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { JobStore } from '../../functions/src/store/job-store';
import { E2E_PROJECT_ID, emulatorAddress, REGION } from '../support/emulators';

jest.setTimeout(150_000);

interface SignedIn {
  readonly app: FirebaseApp;
  readonly db: Firestore;
  readonly uid: string;
  client(fetch?: FetchLike): PhaselineClient;
}

const apps: SignedIn[] = [];
let admin: App;
let adminDb: AdminFirestore;
let store: JobStore;
let owner: SignedIn;

async function signIn(name: string): Promise<SignedIn> {
  const [firestoreHost = '127.0.0.1', firestorePort = ''] = (process.env.FIRESTORE_EMULATOR_HOST ?? '').split(':');
  const app = initializeApp({ projectId: E2E_PROJECT_ID, apiKey: 'demo-key', authDomain: 'localhost' }, `${name}-${randomUUID()}`);
  const { auth, db } = connectFirebase(app, { authUrl: `http://${await emulatorAddress('auth')}`, firestoreHost, firestorePort: Number(firestorePort) });
  const user = await signedInUser(auth);
  const functionsBaseUrl = `http://${await emulatorAddress('functions')}/${E2E_PROJECT_ID}/${REGION}`;
  const signedIn: SignedIn = {
    app,
    db,
    uid: user.uid,
    client: (fetch) => createPhaselineClient({ db, functionsBaseUrl, idToken: idTokenOf(auth), ...(fetch ? { fetch } : {}) }),
  };
  apps.push(signedIn);
  return signedIn;
}

beforeAll(async () => {
  admin = initializeAdminApp({ projectId: E2E_PROJECT_ID }, `frontend-client-e2e-${process.pid}`);
  adminDb = adminFirestore(admin);
  store = new JobStore(adminDb, systemClock, resolveEngineOptions());
  owner = await signIn('owner');
});

afterAll(async () => {
  for (const { app, db } of apps) {
    await terminate(db);
    await deleteApp(app);
  }
  await deleteAdminApp(admin);
});

/** A research job of the owner, written and left queued with no task: nothing runs it until it is answered. */
async function queuedResearchJob(question: string): Promise<JobRecord> {
  const created = await store.createJob({ owner: owner.uid, pipeline: 'research', input: { question, experts: 1, sections: 1, wordsPerSection: 50 }, conversationId: null, idempotencyKey: null });
  if (!('created' in created)) throw new Error('createJob reported a conflict');
  return created.job;
}

/** The platform's fetch, except that the first answer from `submitJob` is lost on its way back (the request did arrive). */
function losingFirstSubmitAnswer(): { fetch: FetchLike; tries: () => number } {
  let tries = 0;
  const fetch: FetchLike = async (url, init) => {
    const answer = await globalThis.fetch(url, init);
    if (url.endsWith('/submitJob') && (tries += 1) === 1) {
      await answer.body?.cancel();
      throw new TypeError('fetch failed: the connection was reset');
    }
    return answer;
  };
  return { fetch, tries: () => tries };
}

test('submitted twice with one key (once through a lost answer): one job, watched to its published answer', async () => {
  const idempotencyKey = `frontend-client-${randomUUID()}`;
  const request = { pipeline: 'canary', input: { text: 'One paragraph here.\n\nAnd a second, longer paragraph of text.' }, idempotencyKey };
  const lossy = losingFirstSubmitAnswer();

  // The first try makes the job and its answer is lost; the retry, with the same key, gets that job back.
  const first = await owner.client(lossy.fetch).submit(request);
  expect(lossy.tries()).toBe(2);
  expect(first).toEqual({ jobId: first.jobId, status: expect.any(String) as unknown, statusPath: `jobs/${first.jobId}`, replayed: true, idempotencyKey });
  // A second submission of the same message (a reload that resends it): the same job again.
  const again = await owner.client().submit(request);
  expect([again.jobId, again.replayed]).toEqual([first.jobId, true]);
  const sameKey = await adminDb.collection('jobs').where('owner', '==', owner.uid).where('idempotencyKey', '==', idempotencyKey).get();
  expect(sameKey.docs.map((job) => job.id)).toEqual([first.jobId]);

  const client = owner.client();
  const statuses: string[] = [];
  let ended: JobSnapshot | null = null;
  let afterStop = 0;
  let stopped = false;
  await new Promise<void>((resolve, reject) => {
    const stop = client.watch(
      first.jobId,
      (snapshot) => {
        if (stopped) afterStop += 1;
        const status = snapshot.job?.status;
        if (status && statuses.at(-1) !== status) statuses.push(status);
        if (snapshot.ended && !stopped) {
          ended = snapshot;
          stopped = true;
          stop();
          resolve();
        }
      },
      { onError: (error) => reject(new Error(`${error.part}: ${error.code} ${error.message}`)) },
    );
  });
  const done = ended as JobSnapshot | null;
  expect(done?.job).toMatchObject({ id: first.jobId, status: 'completed', outcome: 'complete', pipeline: 'canary' });
  expect(statuses.at(-1)).toBe('completed');
  expect(done?.result?.markdown).toContain('2 paragraphs, 10 words.');
  expect(done?.question).toBeNull();
  expect(done?.writing).toEqual([]);

  // The timeline as the engine wrote it, oldest first.
  const events = await adminDb.collection(`jobs/${first.jobId}/events`).orderBy('atMs').get();
  const kinds = (done?.events ?? []).map((event) => event.kind);
  expect(kinds.at(0)).toBe('submitted');
  expect(kinds.at(-1)).toBe('completed');
  expect(kinds.length).toBeLessThanOrEqual(events.size);

  // Stopped means stopped: a later event reaches a new watch on the same Firestore, never the stopped one.
  await adminDb.doc(`jobs/${first.jobId}/events/zz-after-stop`).set({ kind: 'note', message: 'written after the watch stopped', unit: null, atMs: Date.now() + 60_000 });
  const later = await client.waitFor(first.jobId, (snapshot) => snapshot.events.some((event) => event.id === 'zz-after-stop'));
  expect(later.events.at(-1)?.message).toBe('written after the watch stopped');
  expect(afterStop).toBe(0);
});

test("a waiting job's question is read from the snapshot and answered; the job goes on to its report", async () => {
  const queued = await queuedResearchJob('Which storage layout suits a durable job pipeline?');
  const waiting = await store.transact(queued.id, () => null, ({ job }) =>
    Promise.resolve({
      next: { ...job, status: 'waiting' as const, waiting: { reason: 'decision' as const, questionId: 'depth', question: 'How deep should the report go?', options: ['Short overview', 'In depth'], untilMs: null } },
      events: [{ kind: 'waiting', message: 'Waiting for a decision: How deep should the report go?' }],
      value: job,
    }),
  );
  const client = owner.client();

  const asked = await client.waitFor(queued.id, (snapshot) => snapshot.question !== null);
  expect(asked.question).toEqual({ jobId: queued.id, questionId: 'depth', question: 'How deep should the report go?', options: ['Short overview', 'In depth'], reason: 'decision', step: waiting.step, untilMs: null });

  // An answer that is not one of the options is refused, and not retried.
  await expect(client.answer(queued.id, 'depth', 'Maybe')).rejects.toMatchObject({ status: 400, code: 'invalid_request', attempts: 1 });
  await expect(client.answer(queued.id, 'depth', 'In depth')).resolves.toEqual({ jobId: queued.id, status: 'queued' });
  // Answered already: the job no longer waits.
  await expect(client.answer(queued.id, 'depth', 'Short overview')).rejects.toMatchObject({ status: 409, code: 'conflict' });

  const finished = await client.waitFor(queued.id, (snapshot) => snapshot.ended, {});
  expect(finished.job).toMatchObject({ status: 'completed', decisions: { depth: 'In depth' }, question: 'Which storage layout suits a durable job pipeline?' });
  expect(finished.question).toBeNull();
  expect(finished.result?.title).toBe('Research report: Which storage layout suits a durable job pipeline?');
  expect(finished.units.map((unit) => unit.status)).toEqual(['done']);
  expect(finished.sections.filter((section) => section.phase === 'final-document' && section.text !== null).length).toBeGreaterThanOrEqual(1);
  const kinds = finished.events.map((event) => event.kind);
  expect(kinds.indexOf('decided')).toBeGreaterThan(kinds.indexOf('waiting'));
  expect(kinds.at(-1)).toBe('completed');
});

test('a queued job is cancelled through the client; a second cancel is a 409; a stranger cannot watch it', async () => {
  const queued = await queuedResearchJob('How should a pipeline report effects it cannot confirm?');
  const client = owner.client();
  await client.waitFor(queued.id, (snapshot) => snapshot.job?.status === 'queued');

  const cancelled = await client.cancel(queued.id, 'changed my mind');
  expect(cancelled).toMatchObject({ jobId: queued.id, status: 'cancelled', unknownEffects: 0 });
  expect(cancelled.report).toContain('Cancelled by its owner');

  const seen = await client.waitFor(queued.id, (snapshot) => snapshot.ended);
  expect(seen.job).toMatchObject({ status: 'cancelled', cancellation: { reason: 'changed my mind' } });
  expect(seen.job?.cancellation?.report).toBe(cancelled.report);
  expect(seen.result).toBeNull();

  const error = await client.cancel(queued.id).catch((caught: unknown) => caught);
  expect(error).toBeInstanceOf(PhaselineApiError);
  expect(error).toMatchObject({ status: 409, code: 'conflict', retryable: false });

  const stranger = await signIn('stranger');
  await expect(stranger.client().waitFor(queued.id, () => true)).rejects.toThrow(/permission-denied/);
  await expect(stranger.client().cancel(queued.id)).rejects.toMatchObject({ status: 404, code: 'not_found' });
});
