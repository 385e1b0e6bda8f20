import { z } from 'zod';
import { ManualClock } from '../../functions/src/core/clock';
import { stepTaskId } from '../../functions/src/core/job';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { definePhase, definePipeline, pipelineRegistry } from '../../functions/src/core/pipeline';
import type { SubmitLogger } from '../../functions/src/engine/submit';
import type { HttpRequest, HttpResponse } from '../../functions/src/http/request';
import { createSubmitHandler, type SubmitHandlerDeps } from '../../functions/src/http/submit-handler';
import { JobStore, jobIdForIdempotencyKey } from '../../functions/src/store/job-store';
import { openTestFirestore, type TestFirestore } from '../support/firestore';
import { RecordingTaskQueue } from '../support/task-queue';

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

class FakeResponse implements HttpResponse {
  statusCode: number | undefined;
  readonly headers = new Map<string, string>();
  body: unknown;
  sent = 0;
  status(code: number): this {
    this.statusCode = code;
    return this;
  }
  set(field: string, value: string): this {
    this.headers.set(field.toLowerCase(), value);
    return this;
  }
  json(body: unknown): this {
    this.body = body;
    this.sent += 1;
    return this;
  }
  end(): this {
    this.sent += 1;
    return this;
  }
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
