import { z } from 'zod';
import { ManualClock } from '../../functions/src/core/clock';
import { stepTaskId } from '../../functions/src/core/job';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { definePhase, definePipeline, pipelineRegistry } from '../../functions/src/core/pipeline';
import { type SubmitLogger, submitJob } from '../../functions/src/engine/submit';
import type { HttpRequest, HttpResponse } from '../../functions/src/http/request';
import { createSubmitHandler, type SubmitHandlerDeps } from '../../functions/src/http/submit-handler';
import { JobStore, jobIdForIdempotencyKey, type NewJob } from '../../functions/src/store/job-store';
import { openTestFirestore, type TestFirestore } from '../support/firestore';
import { RecordingTaskQueue } from '../support/task-queue';
import { RecordingResponse } from '../support/http';
import type { QuotaDefaults } from '../../functions/src/core/quota';
import { SubmitQuota, setUserLimits, type Submitter } from '../../functions/src/store/quota-documents';
import { ANONYMOUS_TOTAL_PATH, conversationPath, quotaUsagePath, jobPath, userLimitsPath } from '../../functions/src/store/paths';
import { afterFirstGetAll, whileInterposed } from '../support/interpose';

const echoInput = z.strictObject({ text: z.string().min(1).max(1000) });
type EchoInput = z.infer<typeof echoInput>;

const echo = definePipeline<EchoInput>({
  name: 'echo',
  description: 'Repeats its text once',
  input: echoInput,
  phases: [
    definePhase<EchoInput, { text: string }>({
      name: 'repeat',
      state: z.object({ text: z.string() }),
      run: (context) => Promise.resolve({ kind: 'done', state: { text: context.input.text } }),
    }),
  ],
  publish: () => ({ outcome: 'complete', title: 'Echo', markdown: '', missing: [] }),
});

const VALID = { pipeline: 'echo', input: { text: 'hello' } };

/** Tokens are `token-<name>` and name the user `uid-<name>`; anything else is refused, as an expired token would be. */
const verifyToken: SubmitHandlerDeps['verifyToken'] = (token) => {
  const name = /^token-([a-z]+)$/.exec(token)?.[1];
  return name ? Promise.resolve({ uid: `uid-${name}` }) : Promise.reject(new Error('Firebase ID token has expired'));
};

class RecordingLogger implements SubmitLogger {
  readonly warnings: { message: string; fields: Record<string, unknown> | undefined }[] = [];
  readonly errors: { message: string; fields: Record<string, unknown> | undefined }[] = [];
  warn(message: string, fields?: Record<string, unknown>): void {
    this.warnings.push({ message, fields });
  }
  error(message: string, fields?: Record<string, unknown>): void {
    this.errors.push({ message, fields });
  }
}

class FakeResponse extends RecordingResponse {
  /** The readable message of an error answer. */
  get message(): string {
    const parsed = z.object({ error: z.string(), message: z.string() }).parse(this.body);
    return parsed.message;
  }
}

interface RequestShape {
  readonly method?: string;
  /** Header overrides; `undefined` removes a default header. */
  readonly headers?: Readonly<Record<string, string | undefined>>;
  /** The parsed body, as the framework would present it. */
  readonly body?: unknown;
  /** The raw bytes; by default the JSON of `body`; `null` for a request without them. */
  readonly raw?: string | Buffer | null;
}

function request(shape: RequestShape = {}): HttpRequest {
  const headers = new Map<string, string>();
  const all: Record<string, string | undefined> = { authorization: 'Bearer token-alice', 'content-type': 'application/json', ...shape.headers };
  for (const [name, value] of Object.entries(all)) if (value !== undefined) headers.set(name.toLowerCase(), value);
  const body = 'body' in shape ? shape.body : VALID;
  const raw = shape.raw === undefined ? Buffer.from(JSON.stringify(body), 'utf8') : shape.raw;
  const rawBody = raw === null ? undefined : Buffer.isBuffer(raw) ? raw : Buffer.from(raw, 'utf8');
  return { method: shape.method ?? 'POST', get: (name) => headers.get(name.toLowerCase()), body, ...(rawBody ? { rawBody } : {}) };
}

let firestore: TestFirestore;
let queue: RecordingTaskQueue;
let logger: RecordingLogger;
let store: JobStore;
let handle: (request: HttpRequest, response: HttpResponse) => Promise<void>;

async function submit(shape: RequestShape = {}): Promise<FakeResponse> {
  const response = new FakeResponse();
  await handle(request(shape), response);
  expect(response.sent).toBe(1);
  return response;
}

async function jobCount(): Promise<number> {
  return (await firestore.db.collection('jobs').get()).size;
}

async function expectNothingWritten(): Promise<void> {
  expect(await jobCount()).toBe(0);
  expect((await firestore.db.collectionGroup('events').get()).size).toBe(0);
  expect((await firestore.db.collection('conversations').get()).size).toBe(0);
  expect(queue.tasks).toEqual([]);
  expect(queue.duplicates).toEqual([]);
}

beforeAll(() => {
  firestore = openTestFirestore('submit');
});
beforeEach(async () => {
  await firestore.reset();
  queue = new RecordingTaskQueue();
  logger = new RecordingLogger();
  store = new JobStore(firestore.db, new ManualClock(), resolveEngineOptions());
  handle = createSubmitHandler({ store, queue, verifyToken, pipelines: pipelineRegistry(echo), logger });
});
afterAll(() => firestore.close());

describe('refused requests write nothing', () => {
  const big = { pipeline: 'echo', input: { text: 'x'.repeat(70_000) } };
  const cases: [string, RequestShape, number, RegExp][] = [
    ['GET', { method: 'GET' }, 405, /Method GET is not allowed: submit a job with POST/],
    ['PUT', { method: 'PUT' }, 405, /Method PUT is not allowed/],
    ['DELETE', { method: 'DELETE' }, 405, /Method DELETE is not allowed/],
    ['no Authorization header', { headers: { authorization: undefined } }, 401, /Missing Authorization header/],
    ['Basic scheme', { headers: { authorization: 'Basic dXNlcjpwYXNz' } }, 401, /must use the Bearer scheme/],
    ['Bearer without a token', { headers: { authorization: 'Bearer' } }, 401, /no token after "Bearer"/],
    ['garbled Authorization', { headers: { authorization: 'Bearer token-alice extra' } }, 401, /Authorization header is malformed/],
    ['a token that fails verification', { headers: { authorization: 'Bearer expired.jwt.value' } }, 401, /ID token was rejected/],
    ['text/plain', { headers: { 'content-type': 'text/plain' } }, 415, /Content-Type must be application\/json; got "text\/plain"/],
    ['no Content-Type', { headers: { 'content-type': undefined } }, 415, /Content-Type must be application\/json; got no Content-Type/],
    ['form encoding', { headers: { 'content-type': 'application/x-www-form-urlencoded' }, raw: 'pipeline=echo' }, 415, /application\/json/],
    ['malformed JSON', { raw: '{"pipeline": "echo", "input": ' }, 400, /not valid JSON/],
    ['malformed JSON the framework left as a string', { body: '{"pipeline":', raw: null }, 400, /not valid JSON/],
    ['an empty body', { raw: '' }, 400, /body is empty/],
    ['an array body', { body: [VALID] }, 400, /must be a JSON object.*got an array/],
    ['a number body', { body: 42 }, 400, /must be a JSON object.*got a number/],
    ['an unknown pipeline', { body: { pipeline: 'essay', input: { text: 'hi' } } }, 400, /Unknown pipeline "essay" \(known pipelines: "echo"\)/],
    ['a missing pipeline', { body: { input: { text: 'hi' } } }, 400, /pipeline is required[\s\S]*→ at pipeline/],
    ['a pipeline that is not a string', { body: { pipeline: ['echo'], input: { text: 'hi' } } }, 400, /pipeline must be a string, not an array[\s\S]*→ at pipeline/],
    ['a missing input', { body: { pipeline: 'echo' } }, 400, /input is required[\s\S]*→ at input/],
    ['input of the wrong type', { body: { pipeline: 'echo', input: 'hello' } }, 400, /expected object, received string[\s\S]*→ at input$/],
    ['input failing the pipeline schema', { body: { pipeline: 'echo', input: { text: '' } } }, 400, /Too small[\s\S]*→ at input\.text/],
    ['input with a field the pipeline lacks', { body: { pipeline: 'echo', input: { text: 'hi', tone: 'dry' } } }, 400, /Unrecognized key: "tone"[\s\S]*→ at input/],
    ['an extra top-level field', { body: { ...VALID, priority: 'high' } }, 400, /Unrecognized key: "priority"/],
    ['a conversationId with a slash', { body: { ...VALID, conversationId: 'chats/1' } }, 400, /conversationId must be 1 to 128 letters[\s\S]*→ at conversationId/],
    ['a reserved conversationId', { body: { ...VALID, conversationId: '__all__' } }, 400, /conversationId has the form __name__, which is reserved by Firestore/],
    ['bug 6: a conversationId of ".."', { body: { ...VALID, conversationId: '..' } }, 400, /conversationId must be 1 to 128 letters[\s\S]*→ at conversationId/],
    ['bug 6: a conversationId over 128 characters', { body: { ...VALID, conversationId: 'c'.repeat(129) } }, 400, /conversationId must be 1 to 128 [^\n]*\(it is 129 characters long\)/],
    ['an oversize body', { body: big }, 413, /body is 700\d\d bytes; the limit is 65536 bytes \(64 KiB\)/],
    ['an oversize parsed body without raw bytes', { body: big, raw: null }, 413, /the limit is 65536 bytes/],
    ['an empty Idempotency-Key', { headers: { 'idempotency-key': '' } }, 400, /Idempotency-Key must be 1 to 200 printable ASCII characters; it is empty/],
    ['a long Idempotency-Key', { headers: { 'idempotency-key': 'k'.repeat(201) } }, 400, /Idempotency-Key[\s\S]*201 characters long/],
    ['a non-ASCII Idempotency-Key', { headers: { 'idempotency-key': 'commande-é' } }, 400, /Idempotency-Key[\s\S]*outside printable ASCII/],
  ];

  test.each(cases)('%s', async (_name, shape, status, message) => {
    const response = await submit({ ...shape, headers: { origin: 'https://chat.example', ...shape.headers } });
    expect(response.statusCode).toBe(status);
    expect(response.message).toMatch(message);
    expect(response.headers.get('access-control-allow-origin')).toBe('https://chat.example');
    if (status === 405) expect(response.headers.get('allow')).toBe('POST, OPTIONS');
    if (status === 401) expect(response.headers.get('www-authenticate')).toMatch(/^Bearer realm="phaseline"/);
    await expectNothingWritten();
    expect(logger.errors).toEqual([]);
  });
});

describe('bug 32: ill-formed text', () => {
  test.each([
    ['a lone high surrogate in the input', { pipeline: 'echo', input: { text: 'before \ud800 after' } }, /input\.text/],
    ['a lone low surrogate', { pipeline: 'echo', input: { text: '\udc00' } }, /input\.text/],
    ['one in an unknown field name', { pipeline: 'echo', input: { text: 'hi', ['k\ud800']: 1 } }, /a field name in input/],
  ])('bug 32: %s is a 400 naming where it is (not a 500 that says to retry); nothing is written', async (_name, body, where) => {
    const response = await submit({ body });
    expect(response.statusCode).toBe(400);
    expect(response.body).toMatchObject({ error: 'invalid_text' });
    expect(response.message).toMatch(where);
    expect(response.message).toMatch(/lone surrogate/);
    await expectNothingWritten();
    expect(logger.errors).toEqual([]);
  });

  test('paired surrogates (an emoji) are well-formed text and accepted', async () => {
    const response = await submit({ body: { pipeline: 'echo', input: { text: 'ship it \ud83d\ude80' } } });
    expect(response.statusCode).toBe(202);
  });
});

describe('an accepted job', () => {
  test('answers 202 with exactly the documented body, writes a queued job and enqueues one task', async () => {
    const response = await submit();
    expect(response.statusCode).toBe(202);
    const body = z.object({ taskId: z.string() }).parse(response.body);
    const jobId = body.taskId;
    expect(response.body).toStrictEqual({ taskId: jobId, status: 'queued', statusPath: `jobs/${jobId}` });
    expect(response.headers.get('access-control-allow-origin')).toBe('*');
    expect(response.headers.has('idempotent-replayed')).toBe(false);

    const job = await store.read(jobId);
    expect(job).toMatchObject({ status: 'queued', owner: 'uid-alice', pipeline: 'echo', input: { text: 'hello' }, conversationId: null, idempotencyKey: null, step: 0, epoch: 0 });
    expect(queue.tasks).toEqual([{ id: stepTaskId(jobId, 0, 0), task: { jobId, step: 0 }, delaySeconds: 0 }]);
    expect(logger.warnings).toEqual([]);
  });

  test('accepts a body the framework already parsed (no raw bytes) and a charset parameter', async () => {
    const response = await submit({ raw: null, headers: { 'content-type': 'application/json; charset=utf-8' } });
    expect(response.statusCode).toBe(202);
    expect(await jobCount()).toBe(1);
    expect(queue.tasks).toHaveLength(1);
  });

  test('without a key, two identical submits are two jobs', async () => {
    const first = await submit();
    const second = await submit();
    expect(first.body).not.toEqual(second.body);
    expect(await jobCount()).toBe(2);
    expect(queue.tasks).toHaveLength(2);
  });

  test('an enqueue failure still answers 202: the job is durable and queued for the sweeper', async () => {
    queue.failNext = 1;
    const response = await submit();
    expect(response.statusCode).toBe(202);
    const { taskId } = z.object({ taskId: z.string() }).parse(response.body);
    expect(response.body).toStrictEqual({ taskId, status: 'queued', statusPath: `jobs/${taskId}` });
    expect((await store.read(taskId))?.status).toBe('queued');
    expect(queue.tasks).toEqual([]);
    expect(logger.warnings).toHaveLength(1);
    expect(logger.warnings[0]?.fields).toMatchObject({ jobId: taskId, taskId: stepTaskId(taskId, 0, 0), error: expect.stringContaining('Cloud Tasks unavailable') as unknown });
  });
});

describe('Idempotency-Key', () => {
  const keyed = (key: string, token = 'token-alice', body: unknown = VALID): RequestShape => ({
    headers: { 'idempotency-key': key, authorization: `Bearer ${token}` },
    body,
  });

  test('fault 10: a client that retries its submit (after a timeout) gets the same answer and nothing more is enqueued', async () => {
    const first = await submit(keyed('order-1'));
    const second = await submit(keyed('order-1'));
    expect(first.statusCode).toBe(202);
    expect(second.statusCode).toBe(202);
    expect(second.body).toStrictEqual(first.body);
    expect(first.body).toMatchObject({ taskId: jobIdForIdempotencyKey('uid-alice', 'order-1') });
    expect(second.headers.get('idempotent-replayed')).toBe('true');
    expect(await jobCount()).toBe(1);
    expect(queue.tasks).toHaveLength(1);
    expect(queue.duplicates).toEqual([]);
  });

  test('concurrent submits with one key make one job and one task, and all get the same answer', async () => {
    const responses = await Promise.all(Array.from({ length: 4 }, () => submit(keyed('burst'))));
    for (const response of responses) {
      expect(response.statusCode).toBe(202);
      expect(response.body).toStrictEqual(responses[0]?.body);
    }
    expect(responses.filter((response) => response.headers.has('idempotent-replayed'))).toHaveLength(3);
    expect(await jobCount()).toBe(1);
    expect(queue.tasks).toHaveLength(1);
    expect(queue.duplicates).toEqual([]);
  });

  test('a repeat reports the job as it is now', async () => {
    const first = await submit(keyed('order-2'));
    const { taskId } = z.object({ taskId: z.string() }).parse(first.body);
    await firestore.db.doc(`jobs/${taskId}`).update({ status: 'running' });
    const again = await submit(keyed('order-2'));
    expect(again.statusCode).toBe(202);
    expect(again.body).toStrictEqual({ taskId, status: 'running', statusPath: `jobs/${taskId}` });
    expect(queue.tasks).toHaveLength(1);
  });

  test('the same key with a different body is 422 and changes nothing', async () => {
    const first = await submit(keyed('order-3'));
    const other = await submit(keyed('order-3', 'token-alice', { pipeline: 'echo', input: { text: 'something else' } }));
    expect(other.statusCode).toBe(422);
    expect(other.message).toMatch(/Idempotency-Key was already used for a different request/);
    expect(await jobCount()).toBe(1);
    expect(queue.tasks).toHaveLength(1);
    const { taskId } = z.object({ taskId: z.string() }).parse(first.body);
    expect((await store.read(taskId))?.input).toEqual({ text: 'hello' });
  });

  test('different owners with the same key get two jobs', async () => {
    const alice = await submit(keyed('shared-key', 'token-alice'));
    const bob = await submit(keyed('shared-key', 'token-bob'));
    expect(alice.statusCode).toBe(202);
    expect(bob.statusCode).toBe(202);
    const aliceJob = z.object({ taskId: z.string() }).parse(alice.body).taskId;
    const bobJob = z.object({ taskId: z.string() }).parse(bob.body).taskId;
    expect(aliceJob).not.toBe(bobJob);
    expect((await store.read(aliceJob))?.owner).toBe('uid-alice');
    expect((await store.read(bobJob))?.owner).toBe('uid-bob');
    expect(queue.tasks.map((task) => task.id).sort()).toEqual([stepTaskId(aliceJob, 0, 0), stepTaskId(bobJob, 0, 0)].sort());
  });
});

describe('CORS', () => {
  test('a preflight answers 204 with what the endpoint accepts', async () => {
    const response = await submit({ method: 'OPTIONS', headers: { origin: 'https://chat.example', 'access-control-request-method': 'POST' }, raw: null, body: undefined });
    expect(response.statusCode).toBe(204);
    expect(response.body).toBeUndefined();
    expect(Object.fromEntries(response.headers)).toEqual({
      'access-control-allow-origin': 'https://chat.example',
      vary: 'Origin',
      'access-control-allow-methods': 'POST, OPTIONS',
      'access-control-allow-headers': 'Authorization, Content-Type, Idempotency-Key',
      'access-control-max-age': '3600',
      allow: 'POST, OPTIONS',
    });
    await expectNothingWritten();
  });

  test('a preflight without an Origin allows any origin, and needs no token', async () => {
    const response = await submit({ method: 'OPTIONS', headers: { authorization: undefined, 'content-type': undefined }, raw: null, body: undefined });
    expect(response.statusCode).toBe(204);
    expect(response.headers.get('access-control-allow-origin')).toBe('*');
  });
});

describe('internal failures', () => {
  test('a store failure is a 500 with a generic message and a log line', async () => {
    const failing = createSubmitHandler({
      store: { createJob: () => Promise.reject(new Error('DEADLINE_EXCEEDED: secret internals')) },
      queue,
      verifyToken,
      pipelines: pipelineRegistry(echo),
      logger,
    });
    const response = new FakeResponse();
    await failing(request(), response);
    expect(response.statusCode).toBe(500);
    expect(response.message).toMatch(/internal error/);
    expect(response.message).not.toMatch(/secret/);
    expect(response.headers.get('access-control-allow-origin')).toBe('*');
    expect(logger.errors).toHaveLength(1);
    expect(logger.errors[0]?.fields).toMatchObject({ error: expect.stringContaining('secret internals') as unknown });
    expect(queue.tasks).toEqual([]);
  });
});

/**
 * A submit reads plainly and makes one commit: the job, its first event, its conversation's record
 * and the owner's usage, the usage conditioned on the version the admission read. No transaction
 * locks the user's usage document; a submit whose reads went stale decides again.
 */
describe('submit commits: what one submit writes, conditioned', () => {
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
    const late = await whileInterposed(interposed, () => store.createJob(request('uid-alice', 'four'), quota.admission({ uid: 'uid-alice', anonymous: false })));
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
    const late = await whileInterposed(interposed, () => store.createJob(request('uid-late', 'three'), anonymous('uid-late')));
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
});

/**
 * A submit is plain reads and one commit conditioned on the owner's
 * usage. These tests race submits (and operators) against each other on the Firestore emulator,
 * interposing a write between a submit's reads and its commit where a deterministic race is needed.
 */
describe('submits racing each other', () => {
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
      const repeat = await whileInterposed(interposed, () => submitJob(deps(LIMITS), request('hello', key)));
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
      const other = await whileInterposed(interposed, () => submitJob(deps(LIMITS), request('another body', key)));
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
      const outcome = await whileInterposed(interposed, () => submitJob(deps(ROOMY), request('after the cut')));
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
      const anonymous = await whileInterposed(interposed, () => submitJob(deps(LIMITS), request('anonymous'), { anonymous: true }));
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
});
