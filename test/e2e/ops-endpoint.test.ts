/**
 * `opsAction` as deployed: over HTTP through the functions emulator, with real ID tokens from the
 * Auth emulator. A signed-in user without the `admin` claim is refused (403) and the job stays as it
 * was; an operator (the claim set with the admin SDK, as `phaseline admin grant` does) releases a
 * quarantined job of another user, which the functions then run to completion, cancels one and
 * re-drives a failed one;
 * an operator whose claim is revoked (refresh tokens revoked too) is refused at the next call.
 */
import { randomUUID } from 'node:crypto';
import { deleteApp, initializeApp, type App } from 'firebase-admin/app';
import { getAuth } from 'firebase-admin/auth';
import { getFirestore, type Firestore } from 'firebase-admin/firestore';
import { systemClock } from '../../functions/src/core/clock';
import type { JobRecord } from '../../functions/src/core/job';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { JobStore } from '../../functions/src/store/job-store';
import { anonymousUser, E2E_PROJECT_ID, functionUrl } from '../support/emulators';
import { idTokenFor, setClaims, useAuthEmulator } from '../support/operators';

jest.setTimeout(150_000);

let admin: App;
let db: Firestore;
let store: JobStore;
let url: string;
const OWNER = `ops-endpoint-owner-${randomUUID().slice(0, 8)}`;
const OPERATOR = `ops-endpoint-operator-${randomUUID().slice(0, 8)}`;
let operatorToken: string;

beforeAll(async () => {
  await useAuthEmulator();
  admin = initializeApp({ projectId: E2E_PROJECT_ID }, `ops-endpoint-${process.pid}`);
  db = getFirestore(admin);
  store = new JobStore(db, systemClock, resolveEngineOptions());
  url = await functionUrl('opsAction');
  await setClaims(admin, OPERATOR, { admin: true });
  operatorToken = await idTokenFor(admin, OPERATOR);
});

afterAll(async () => {
  await deleteApp(admin);
});

async function post(body: unknown, token: string | null): Promise<{ status: number; body: Record<string, unknown> }> {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(token === null ? {} : { authorization: `Bearer ${token}` }) },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

async function readJob(jobId: string): Promise<JobRecord> {
  const job = await store.read(jobId);
  if (!job) throw new Error(`No job ${jobId}`);
  return job;
}

async function until(what: string, jobId: string, done: (job: JobRecord) => boolean, timeoutMs = 90_000): Promise<JobRecord> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const job = await readJob(jobId);
    if (done(job)) return job;
    if (Date.now() > deadline) throw new Error(`${what}: not reached in ${timeoutMs} ms; the job is ${job.status}`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

/** A research job of OWNER's, written with no task (nothing runs it), then quarantined as the sweeper leaves one. */
async function job(status: 'queued' | 'quarantined'): Promise<JobRecord> {
  const created = await store.createJob({ owner: OWNER, pipeline: 'research', input: { question: 'What does an operator console need?', experts: 1, sections: 1, wordsPerSection: 50 }, conversationId: null, idempotencyKey: null });
  if (!('created' in created)) throw new Error('createJob reported a conflict');
  if (status === 'queued') return created.job;
  return store.transact(created.job.id, () => null, ({ job: record }) => {
    const nowMs = Date.now();
    const next: JobRecord = { ...record, status: 'quarantined', staleReclaims: 4, quarantine: { reason: 'lost 4 workers without progress', atMs: nowMs }, finishedAtMs: nowMs, updatedAtMs: nowMs };
    return Promise.resolve({ next, events: [{ kind: 'quarantined', message: 'Quarantined: lost 4 workers without progress' }], value: next });
  });
}

async function documentOf(jobId: string): Promise<unknown> {
  const [snapshot, events] = await Promise.all([db.doc(`jobs/${jobId}`).get(), db.collection(`jobs/${jobId}/events`).get()]);
  return { data: snapshot.data(), updateTime: snapshot.updateTime?.toMillis(), events: events.size };
}

test('without a token: 401; a signed-in user without the admin claim: 403 for every action, and the job is untouched', async () => {
  const quarantined = await job('quarantined');
  const before = await documentOf(quarantined.id);
  expect((await post({ action: 'release', jobId: quarantined.id }, null)).status).toBe(401);
  const { idToken } = await anonymousUser();
  for (const body of [
    { action: 'release', jobId: quarantined.id },
    { action: 'cancel', jobId: quarantined.id, reason: 'trying' },
    { action: 'redrive', jobId: quarantined.id, fromPhase: 'outline', reason: 'trying' },
  ]) {
    const answer = await post(body, idToken);
    expect(answer.status).toBe(403);
    expect(answer.body).toMatchObject({ error: 'forbidden', message: expect.stringContaining('not an operator') as unknown });
  }
  expect(await documentOf(quarantined.id)).toEqual(before);
});

test("an operator releases another user's quarantined job: it is queued with a task, and the functions run it to completion", async () => {
  const quarantined = await job('quarantined');
  const answer = await post({ action: 'release', jobId: quarantined.id }, operatorToken);
  expect(answer).toEqual({ status: 200, body: { action: 'release', jobId: quarantined.id, by: OPERATOR, status: 'queued', taskId: `${quarantined.id}-s1-d0`, enqueued: true } });
  const completed = await until('the released job completes', quarantined.id, (record) => record.status === 'completed');
  expect(completed).toMatchObject({ owner: OWNER, quarantine: null, staleReclaims: 0 });
  const kinds = (await db.collection(`jobs/${quarantined.id}/events`).orderBy('atMs').get()).docs.map((event) => String(event.get('kind')));
  expect(kinds.slice(0, 3)).toEqual(['submitted', 'quarantined', 'released']);
  expect(kinds.at(-1)).toBe('completed');
});

test("an operator cancels another user's queued job; a second cancel is a 409 with the reason", async () => {
  const queued = await job('queued');
  const answer = await post({ action: 'cancel', jobId: queued.id, reason: 'stuck behind a bad input' }, operatorToken);
  expect(answer.status).toBe(200);
  expect(answer.body).toMatchObject({ action: 'cancel', status: 'cancelled', by: OPERATOR });
  expect((await readJob(queued.id)).cancellation).toMatchObject({ reason: 'stuck behind a bad input', by: OPERATOR });
  const again = await post({ action: 'cancel', jobId: queued.id, reason: 'again' }, operatorToken);
  expect(again).toEqual({ status: 409, body: { error: 'conflict', message: `Job ${queued.id} is already cancelled` } });
});

test("an operator re-drives another user's failed job from a phase, and the functions run it to completion", async () => {
  const created = await job('queued');
  const failed = await store.transact(created.id, () => null, ({ job: record }) => {
    const nowMs = Date.now();
    const next: JobRecord = { ...record, status: 'failed', attempts: 5, lastError: { code: 'provider_error', message: 'HTTP 500', retryable: false, atMs: nowMs }, finishedAtMs: nowMs, updatedAtMs: nowMs };
    return Promise.resolve({ next, events: [{ kind: 'failed', message: 'Failed: HTTP 500' }], value: next });
  });
  const answer = await post({ action: 'redrive', jobId: failed.id, fromPhase: 'perspectives', reason: 'the provider is fixed' }, operatorToken);
  expect(answer.status).toBe(200);
  expect(answer.body).toMatchObject({ action: 'redrive', jobId: failed.id, by: OPERATOR, status: 'queued', enqueued: true, resumesAt: 'outline' });
  const completed = await until('the re-driven job completes', failed.id, (record) => record.status === 'completed');
  expect(completed.redrive).toMatchObject({ by: OPERATOR, reason: 'the provider is fixed', fromPhase: 'perspectives', previousStatus: 'failed' });
});

test('an operator whose claim is revoked (refresh tokens revoked too) is refused with the token they still hold', async () => {
  const formerOperator = `ops-endpoint-former-${randomUUID().slice(0, 8)}`;
  await setClaims(admin, formerOperator, { admin: true });
  const token = await idTokenFor(admin, formerOperator);
  const quarantined = await job('quarantined');
  // Revocation is recorded in whole seconds: a token issued in the same second would still pass.
  await new Promise((resolve) => setTimeout(resolve, 1_100));
  await setClaims(admin, formerOperator, {});
  await getAuth(admin).revokeRefreshTokens(formerOperator);
  const answer = await post({ action: 'release', jobId: quarantined.id }, token);
  expect(answer.status).toBe(401);
  expect((await readJob(quarantined.id)).status).toBe('quarantined');
  // Signing in again gives a token without the claim: 403.
  expect((await post({ action: 'release', jobId: quarantined.id }, await idTokenFor(admin, formerOperator))).status).toBe(403);
});
