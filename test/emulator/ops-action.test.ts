/**
 * `opsAction` (functions/src/http/ops-handler.ts) on the official Firestore emulator, called as the
 * trigger calls it, with a token verifier that knows three tokens: an operator's (`admin: true`),
 * a signed-in user's without the claim, and one it rejects. Every refusal is checked to have
 * changed nothing: the job document, its timeline and the task queue stay as they were.
 */
import type { JobRecord } from '../../functions/src/core/job';
import { decodeJob, encodeJob } from '../../functions/src/store/codec';
import { jobPath } from '../../functions/src/store/paths';
import { createOpsActionHandler, type VerifyOperatorToken } from '../../functions/src/http/ops-handler';
import { deployedPipelines } from '../../functions/src/pipelines';
import { engineSuite } from '../support/engine';
import { testPipelines } from '../support/test-pipeline';
import { RecordingResponse } from '../support/http';

const harness = engineSuite('ops-action', testPipelines);

/** The deployed pipelines, as the trigger hands them to the handler (a re-drive reads their phase lists only). */
const deployed = deployedPipelines(() => harness.firestore.db);
const OPERATOR = 'operator-1';
const USER = 'user-1';
const verifyToken: VerifyOperatorToken = (token) => {
  if (token === 'operator-token') return Promise.resolve({ uid: OPERATOR, admin: true });
  if (token === 'user-token') return Promise.resolve({ uid: USER, admin: false });
  return Promise.reject(new Error('bad token'));
};

interface Sent {
  status: number;
  body: Record<string, unknown>;
  headers: Record<string, string>;
}

const logged: { level: string; message: string; fields: Record<string, unknown> | undefined }[] = [];

async function call(body: unknown, options: { token?: string | null; method?: string; contentType?: string } = {}): Promise<Sent> {
  const handler = createOpsActionHandler({
    store: harness.store,
    queue: harness.queue,
    pipelines: deployed,
    verifyToken,
    logger: {
      info: (message, fields) => logged.push({ level: 'info', message, fields }),
      warn: (message, fields) => logged.push({ level: 'warn', message, fields }),
      error: (message, fields) => logged.push({ level: 'error', message, fields }),
    },
  });
  const response = new RecordingResponse();
  const token = options.token === undefined ? 'operator-token' : options.token;
  const headers: Record<string, string> = { 'content-type': options.contentType ?? 'application/json', origin: 'http://127.0.0.1:5173', ...(token === null ? {} : { authorization: `Bearer ${token}` }) };
  await handler({ method: options.method ?? 'POST', get: (name) => headers[name.toLowerCase()], rawBody: Buffer.from(JSON.stringify(body)) }, response);
  return { status: response.statusCode ?? 0, body: (response.body ?? {}) as Record<string, unknown>, headers: response.headersAsSet };
}

async function readJob(jobId: string): Promise<JobRecord> {
  return decodeJob(jobId, (await harness.firestore.db.doc(jobPath(jobId)).get()).data());
}

async function rewriteJob(jobId: string, change: (job: JobRecord) => JobRecord): Promise<void> {
  await harness.firestore.db.doc(jobPath(jobId)).set({ ...encodeJob(change(await readJob(jobId))), requestFingerprint: 'test' });
}

async function timeline(jobId: string): Promise<string[]> {
  const events = await harness.firestore.db.collection(`${jobPath(jobId)}/events`).orderBy('atMs').get();
  return events.docs.map((event) => String(event.get('kind')));
}

/** A job of USER's, quarantined as the sweeper leaves one; its task queue drained. */
async function quarantinedJob(): Promise<string> {
  const jobId = await harness.submit('two-phase', { sections: 1 }, USER);
  harness.queue.drain();
  await rewriteJob(jobId, (job) => ({
    ...job,
    status: 'quarantined',
    epoch: 4,
    step: 4,
    staleReclaims: 4,
    attempts: 1,
    quarantine: { reason: 'its lease expired 4 times without progress', atMs: harness.clock.now() },
    finishedAtMs: harness.clock.now(),
  }));
  return jobId;
}

/** Everything a refused call must leave as it was. */
async function snapshotOf(jobId: string): Promise<unknown> {
  const data = (await harness.firestore.db.doc(jobPath(jobId)).get()).data();
  return { data, timeline: await timeline(jobId), tasks: harness.queue.tasks.length };
}

describe('only an operator acts', () => {
  test.each([
    ['release', (jobId: string) => ({ action: 'release', jobId })],
    ['cancel', (jobId: string) => ({ action: 'cancel', jobId, reason: 'no' })],
    ['redrive', (jobId: string) => ({ action: 'redrive', jobId, fromPhase: 'first', reason: 'again' })],
  ] as const)('a signed-in user without the admin claim gets 403 for %s, and nothing changes', async (_action, body) => {
    const jobId = await quarantinedJob();
    const before = await snapshotOf(jobId);
    const sent = await call(body(jobId), { token: 'user-token' });
    expect(sent.status).toBe(403);
    expect(sent.body).toMatchObject({ error: 'forbidden', message: expect.stringMatching(/^User user-1 is not an operator: .*"admin" custom claim/) as unknown });
    expect(await snapshotOf(jobId)).toEqual(before);
  });

  test('without a token the answer is 401 with a challenge, with a rejected token too; nothing changes', async () => {
    const jobId = await quarantinedJob();
    const before = await snapshotOf(jobId);
    const missing = await call({ action: 'release', jobId }, { token: null });
    expect(missing.status).toBe(401);
    expect(missing.headers['WWW-Authenticate']).toBe('Bearer realm="phaseline"');
    const rejected = await call({ action: 'release', jobId }, { token: 'forged' });
    expect(rejected.status).toBe(401);
    expect(rejected.headers['WWW-Authenticate']).toMatch(/error="invalid_token"/);
    expect(await snapshotOf(jobId)).toEqual(before);
  });

  test('a non-operator learns nothing about the body: a malformed one is a 403 too, not a 400', async () => {
    const sent = await call({ action: 'explode' }, { token: 'user-token' });
    expect(sent.status).toBe(403);
  });
});

describe('an operator', () => {
  test('releases a quarantined job of another user: queued with fresh budgets, its task enqueued, the operator named in the answer', async () => {
    const jobId = await quarantinedJob();
    const sent = await call({ action: 'release', jobId });
    expect(sent.status).toBe(200);
    expect(sent.body).toEqual({ action: 'release', jobId, by: OPERATOR, status: 'queued', taskId: `${jobId}-s5-d0`, enqueued: true });
    expect(await readJob(jobId)).toMatchObject({ status: 'queued', attempts: 0, staleReclaims: 0, quarantine: null, owner: USER });
    expect(harness.queue.tasks.map((task) => task.id)).toEqual([`${jobId}-s5-d0`]);
    expect(await timeline(jobId)).toEqual(['submitted', 'released']);
    // The timeline names who released it.
    const released = await harness.firestore.db.collection(`jobs/${jobId}/events`).where('kind', '==', 'released').get();
    expect(released.docs[0]?.get('message')).toMatch(new RegExp(`^Released from quarantine by operator ${OPERATOR}`));
    expect(logged).toContainEqual({ level: 'info', message: 'opsAction: done', fields: { action: 'release', jobId, by: OPERATOR, status: 'queued' } });
    // The released job runs to completion.
    await harness.drain();
    expect((await readJob(jobId)).status).toBe('completed');
  });

  test("cancels another user's queued job; the cancellation names the operator", async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 }, USER);
    const sent = await call({ action: 'cancel', jobId, reason: 'runaway spend' });
    expect(sent.status).toBe(200);
    expect(sent.body).toMatchObject({ action: 'cancel', jobId, by: OPERATOR, status: 'cancelled', unknownEffects: 0 });
    const job = await readJob(jobId);
    expect(job.status).toBe('cancelled');
    expect(job.cancellation).toMatchObject({ reason: 'runaway spend', by: OPERATOR });
    expect(sent.body).toMatchObject({ report: `Cancelled by operator ${OPERATOR} during its first step (runaway spend).` });
    // Re-driving it is refused, and the refusal says who stopped it.
    const redrive = await call({ action: 'redrive', jobId, fromPhase: 'first', reason: 'try again' });
    expect(redrive).toMatchObject({ status: 409, body: { message: `Job ${jobId} was cancelled by operator ${OPERATOR}; a re-drive would resume the work (and the effects) that cancel stopped. Its owner can submit it again.` } });
    expect(await timeline(jobId)).toEqual(['submitted', 'cancelled']);
  });

  test("bug 32: a lone surrogate in an operator's reason is a 400, not a 500; nothing changes", async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 }, USER);
    const before = await snapshotOf(jobId);
    const sent = await call({ action: 'cancel', jobId, reason: 'runaway \ud800 spend' });
    expect(sent).toMatchObject({ status: 400, body: { error: 'invalid_text', message: expect.stringMatching(/lone surrogate[\s\S]*at reason/) as unknown } });
    expect(await snapshotOf(jobId)).toEqual(before);
  });

  test("re-drives another user's failed job from a phase: queued with fresh budgets, the operator and the reason on its timeline", async () => {
    // The re-drive names phases of the deployed pipelines; canary is one of them.
    const jobId = await harness.submit('canary', { text: 'One paragraph.\n\nAnother one.' }, USER);
    harness.queue.drain();
    await rewriteJob(jobId, (job) => ({ ...job, status: 'failed', attempts: 5, lastError: { code: 'boom', message: 'it broke', retryable: false, atMs: harness.clock.now() }, finishedAtMs: harness.clock.now() }));
    // A phase the pipeline does not have: 409 naming the phases, nothing changed.
    const failed = await snapshotOf(jobId);
    const unknownPhase = await call({ action: 'redrive', jobId, fromPhase: 'nowhere', reason: 'x' });
    expect(unknownPhase).toMatchObject({ status: 409, body: { error: 'conflict', message: 'Pipeline canary has no phase "nowhere"; its phases are split, measure, summarize.' } });
    expect(await snapshotOf(jobId)).toEqual(failed);

    const sent = await call({ action: 'redrive', jobId, fromPhase: 'measure', reason: 'the provider bug is fixed' });
    expect(sent.status).toBe(200);
    expect(sent.body).toMatchObject({ action: 'redrive', jobId, by: OPERATOR, status: 'queued', enqueued: true, resumesAt: 'split' });
    const job = await readJob(jobId);
    expect(job).toMatchObject({ status: 'queued', attempts: 0, owner: USER });
    expect(job.redrive).toMatchObject({ count: 1, fromPhase: 'measure', by: OPERATOR, reason: 'the provider bug is fixed', previousStatus: 'failed' });
    expect(await timeline(jobId)).toEqual(['submitted', 'redriven']);
    expect(harness.queue.tasks.map((task) => task.id)).toEqual([sent.body.taskId]);

    // Again, now that it is queued: refused, nothing changed.
    const queued = await snapshotOf(jobId);
    const again = await call({ action: 'redrive', jobId, fromPhase: 'measure', reason: 'twice' });
    expect(again.status).toBe(409);
    expect(String(again.body.message)).toMatch(/is queued; only a completed, failed or quarantined job can be re-driven/);
    expect(await snapshotOf(jobId)).toEqual(queued);
  });

  test('is refused with 409 and a sentence when the action does not apply, 404 for a job that does not exist; nothing changes', async () => {
    const jobId = await quarantinedJob();
    const before = await snapshotOf(jobId);
    const cancel = await call({ action: 'cancel', jobId, reason: 'x' });
    expect(cancel).toMatchObject({ status: 409, body: { error: 'conflict', message: `Job ${jobId} is already quarantined` } });
    expect(await snapshotOf(jobId)).toEqual(before);

    const queued = await harness.submit('two-phase', { sections: 1 }, USER);
    harness.queue.drain();
    const release = await call({ action: 'release', jobId: queued });
    expect(release).toMatchObject({ status: 409, body: { error: 'conflict', message: `Job ${queued} is queued; only a quarantined job can be released.` } });
    expect((await readJob(queued)).status).toBe('queued');
    expect(harness.queue.tasks).toHaveLength(0);

    for (const body of [{ action: 'release', jobId: 'no-such-job' }, { action: 'cancel', jobId: 'no-such-job', reason: 'x' }]) {
      expect(await call(body)).toMatchObject({ status: 404, body: { error: 'not_found', message: 'No job no-such-job' } });
    }
  });

  test.each([
    [{ action: 'release' }, /jobId/],
    [{ action: 'release', jobId: '../etc' }, /jobId/],
    [{ action: 'release', jobId: 'x', extra: 1 }, /extra/],
    [{ action: 'explode', jobId: 'x' }, /action/],
    [{ action: 'redrive', jobId: 'x', fromPhase: 'first' }, /reason/],
    [{ action: 'redrive', jobId: 'x', fromPhase: 'First Phase', reason: 'r' }, /fromPhase/],
    [{ action: 'cancel', jobId: 'x', reason: '   ' }, /reason/],
  ])('bad input %j is a 400 naming the field', async (body, field) => {
    const sent = await call(body);
    expect(sent.status).toBe(400);
    expect(sent.body.error).toBe('invalid_request');
    expect(String(sent.body.message)).toMatch(field);
  });

  test('answers CORS like the other endpoints: a preflight, and the caller\'s origin on every answer', async () => {
    const preflight = await call({}, { method: 'OPTIONS' });
    expect(preflight.status).toBe(204);
    expect(preflight.headers).toMatchObject({ 'Access-Control-Allow-Methods': 'POST, OPTIONS', 'Access-Control-Allow-Origin': 'http://127.0.0.1:5173' });
    const get = await call({}, { method: 'GET' });
    expect(get.status).toBe(405);
    const text = await call({ action: 'release', jobId: 'x' }, { contentType: 'text/plain' });
    expect(text.status).toBe(415);
    expect(text.headers['Access-Control-Allow-Origin']).toBe('http://127.0.0.1:5173');
  });
});
