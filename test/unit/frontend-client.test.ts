/**
 * The frontend client's pure parts (client/): when a call is tried again and after how long, that
 * every try of a submission carries the same Idempotency-Key, how answers and refusals of the
 * functions are read, and how documents decode into the snapshot a chat UI renders. The fetch and
 * the clock are handed in: nothing here sleeps or opens a socket (test/e2e/frontend-client.test.ts
 * runs the client against the real stack).
 */
import {
  createPhaselineApi,
  DEFAULT_RETRY_POLICY,
  deriveSnapshot,
  draftsInFlight,
  emptySnapshot,
  parseRetryAfter,
  PhaselineApiError,
  questionOf,
  readDraft,
  readJob,
  readResult,
  readSection,
  retryDelayMs,
  type FetchLike,
  type FetchResponseLike,
  type RetryClock,
} from '../../client';

const NOW = Date.UTC(2025, 0, 2, 12, 0, 0);

interface SentRequest {
  readonly url: string;
  readonly headers: Readonly<Record<string, string>>;
  readonly body: unknown;
}

/** An answer the fake functions give: a status, a body, headers; or a lost answer (the request arrived, nothing came back). */
type Scripted = { readonly status: number; readonly body?: unknown; readonly headers?: Readonly<Record<string, string>> } | 'lost';

function response(status: number, body: unknown, headers: Readonly<Record<string, string>> = {}): FetchResponseLike {
  const lower = new Map(Object.entries(headers).map(([name, value]) => [name.toLowerCase(), value]));
  return { status, ok: status >= 200 && status < 300, headers: { get: (name) => lower.get(name.toLowerCase()) ?? null }, json: () => Promise.resolve(body) };
}

/** A fetch that answers from a script, one entry per try, and records what each try sent. */
function scriptedFetch(script: readonly Scripted[]): { fetch: FetchLike; sent: SentRequest[] } {
  const sent: SentRequest[] = [];
  const fetch: FetchLike = (url, init) => {
    sent.push({ url, headers: init.headers, body: JSON.parse(init.body) as unknown });
    const next = script[sent.length - 1];
    if (next === undefined) return Promise.reject(new Error(`unexpected try ${sent.length}`));
    if (next === 'lost') return Promise.reject(new TypeError('fetch failed: socket hang up'));
    return Promise.resolve(response(next.status, next.body ?? null, next.headers));
  };
  return { fetch, sent };
}

/** A clock whose sleeps return at once and are recorded; time moves by what was slept. */
function fakeClock(): RetryClock & { slept: number[] } {
  let now = NOW;
  const slept: number[] = [];
  return {
    slept,
    now: () => now,
    sleep: (ms, signal) => {
      if (signal?.aborted) return Promise.reject(signal.reason as Error);
      slept.push(ms);
      now += ms;
      return Promise.resolve();
    },
  };
}

function api(script: readonly Scripted[], random = () => 0.5) {
  const { fetch, sent } = scriptedFetch(script);
  const clock = fakeClock();
  let tokens = 0;
  const client = createPhaselineApi({
    functionsBaseUrl: 'http://functions.test/demo/us-central1/',
    idToken: () => Promise.resolve(`token-${(tokens += 1)}`),
    fetch,
    clock,
    random,
  });
  return { client, sent, clock };
}

const accepted = (taskId: string, replayed = false): Scripted => ({
  status: 202,
  body: { taskId, status: 'queued', statusPath: `jobs/${taskId}` },
  headers: replayed ? { 'Idempotent-Replayed': 'true' } : {},
});

describe('retry decisions', () => {
  const failure = (status: number, code = 'x', retryAfterMs: number | null = null) => ({ status, code, retryAfterMs });

  it('does not retry a 4xx: the same request would be refused the same way', () => {
    for (const status of [400, 401, 403, 404, 409, 413, 415, 422]) expect(retryDelayMs(failure(status), 1)).toBeNull();
  });

  it("does not retry a 429 for the person's own limit, whatever its Retry-After", () => {
    expect(retryDelayMs(failure(429, 'quota_exceeded', 1_000), 1)).toBeNull();
  });

  it("waits what the server's Retry-After asks for a 429 or a 503, capped", () => {
    expect(retryDelayMs(failure(503, 'contended', 2_000), 1)).toBe(2_000);
    expect(retryDelayMs(failure(429, 'rate_limited', 7_000), 2)).toBe(7_000);
    expect(retryDelayMs(failure(429, 'rate_limited', 3_600_000), 1)).toBe(DEFAULT_RETRY_POLICY.maxRetryAfterMs);
    expect(retryDelayMs(failure(503, 'contended', 90_000), 1, { ...DEFAULT_RETRY_POLICY, maxRetryAfterMs: 10_000 })).toBe(10_000);
  });

  it('backs off exponentially with jitter when the server names no time, up to the cap', () => {
    const policy = { attempts: 10, baseDelayMs: 400, maxDelayMs: 5_000, maxRetryAfterMs: 30_000 };
    expect([1, 2, 3, 4, 5].map((attempt) => retryDelayMs(failure(0, 'network'), attempt, policy, () => 1))).toEqual([400, 800, 1_600, 3_200, 5_000]);
    expect(retryDelayMs(failure(500, 'internal'), 1, policy, () => 0)).toBe(200);
    expect(retryDelayMs(failure(502, 'bad_gateway'), 3, policy, () => 0.5)).toBe(1_200);
  });

  it('stops after the last attempt', () => {
    expect(retryDelayMs(failure(503, 'contended', 2_000), DEFAULT_RETRY_POLICY.attempts)).toBeNull();
  });

  it('reads Retry-After as seconds or as an HTTP date', () => {
    expect(parseRetryAfter('2', NOW)).toBe(2_000);
    expect(parseRetryAfter(' 30 ', NOW)).toBe(30_000);
    expect(parseRetryAfter(new Date(NOW + 45_000).toUTCString(), NOW)).toBe(45_000);
    expect(parseRetryAfter(new Date(NOW - 45_000).toUTCString(), NOW)).toBe(0);
    expect(parseRetryAfter('soon', NOW)).toBeNull();
    expect(parseRetryAfter(null, NOW)).toBeNull();
  });
});

describe('submit', () => {
  it('retries a lost answer with the same key, and the server answers with the job the first try made', async () => {
    const { client, sent, clock } = api(['lost', accepted('job-1', true)]);
    const answer = await client.submit({ pipeline: 'research', input: { question: 'Why?' }, idempotencyKey: 'key-1', conversationId: 'conv-1' });
    expect(answer).toEqual({ jobId: 'job-1', status: 'queued', statusPath: 'jobs/job-1', replayed: true, idempotencyKey: 'key-1' });
    expect(sent.map((request) => request.headers['idempotency-key'])).toEqual(['key-1', 'key-1']);
    expect(sent.map((request) => request.url)).toEqual(['http://functions.test/demo/us-central1/submitJob', 'http://functions.test/demo/us-central1/submitJob']);
    // A fresh token for every try; the same body.
    expect(sent.map((request) => request.headers.authorization)).toEqual(['Bearer token-1', 'Bearer token-2']);
    expect(sent[1]?.body).toEqual({ pipeline: 'research', input: { question: 'Why?' }, conversationId: 'conv-1' });
    expect(sent[0]?.body).toEqual(sent[1]?.body);
    expect(clock.slept).toEqual([300]);
  });

  it('against a server that keeps jobs by key: two submits with one key make one job', async () => {
    const jobsByKey = new Map<string, string>();
    let answersLost = 1;
    const sent: string[] = [];
    const fetch: FetchLike = (_url, init) => {
      const key = init.headers['idempotency-key'] ?? '';
      sent.push(key);
      const replayed = jobsByKey.has(key);
      if (!replayed) jobsByKey.set(key, `job-${jobsByKey.size + 1}`);
      if (answersLost > 0) {
        answersLost -= 1;
        return Promise.reject(new TypeError('fetch failed'));
      }
      const jobId = jobsByKey.get(key) ?? '';
      return Promise.resolve(response(202, { taskId: jobId, status: 'queued', statusPath: `jobs/${jobId}` }, replayed ? { 'idempotent-replayed': 'true' } : {}));
    };
    const client = createPhaselineApi({ functionsBaseUrl: 'http://f', idToken: () => Promise.resolve('t'), fetch, clock: fakeClock() });
    const first = await client.submit({ pipeline: 'canary', input: { text: 'a' } });
    const second = await client.submit({ pipeline: 'canary', input: { text: 'a' }, idempotencyKey: first.idempotencyKey });
    expect(first.idempotencyKey).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(sent).toEqual([first.idempotencyKey, first.idempotencyKey, first.idempotencyKey]);
    expect(jobsByKey.size).toBe(1);
    expect([first.jobId, first.replayed, second.jobId, second.replayed]).toEqual(['job-1', true, 'job-1', true]);
  });

  it('waits out a 503 contended for its Retry-After, then succeeds', async () => {
    const { client, sent, clock } = api([
      { status: 503, body: { error: 'contended', message: 'Try again in 2 seconds', retryAfterSeconds: 2 }, headers: { 'Retry-After': '2' } },
      accepted('job-2'),
    ]);
    const answer = await client.submit({ pipeline: 'canary', input: {}, idempotencyKey: 'k' });
    expect([answer.jobId, answer.replayed]).toEqual(['job-2', false]);
    expect(sent).toHaveLength(2);
    expect(clock.slept).toEqual([2_000]);
  });

  it('waits a far Retry-After only up to the cap', async () => {
    const { client, clock } = api([{ status: 429, body: { error: 'rate_limited', message: 'slow down' }, headers: { 'retry-after': '600' } }, accepted('job-3')]);
    await client.submit({ pipeline: 'canary', input: {}, idempotencyKey: 'k' });
    expect(clock.slept).toEqual([DEFAULT_RETRY_POLICY.maxRetryAfterMs]);
  });

  it('does not retry a 400: the error carries its status, code and sentence', async () => {
    const { client, sent, clock } = api([{ status: 400, body: { error: 'invalid_request', message: 'Invalid input for pipeline "research": question is too short' } }]);
    const error = await client.submit({ pipeline: 'research', input: { question: 'x' } }).catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(PhaselineApiError);
    expect(error).toMatchObject({ status: 400, code: 'invalid_request', message: 'Invalid input for pipeline "research": question is too short', attempts: 1, retryable: false, limitReached: false });
    expect(sent).toHaveLength(1);
    expect(clock.slept).toEqual([]);
  });

  it("reports a limit at once: quota_exceeded is not retried, and says when to try again", async () => {
    const { client, sent } = api([
      {
        status: 429,
        body: { error: 'quota_exceeded', message: 'You have 3 jobs in flight, the most allowed.', limit: 'jobs_in_flight', allowed: 3, retryAfterSeconds: 30 },
        headers: { 'Retry-After': '30' },
      },
    ]);
    const error = (await client.submit({ pipeline: 'canary', input: {} }).catch((caught: unknown) => caught)) as PhaselineApiError;
    expect(sent).toHaveLength(1);
    expect([error.status, error.code, error.limitReached, error.retryable, error.retryAfterSeconds]).toEqual([429, 'quota_exceeded', true, false, 30]);
    expect(error.details).toEqual({ limit: 'jobs_in_flight', allowed: 3, retryAfterSeconds: 30 });
  });

  it('gives up after the policy\'s attempts, with the last failure', async () => {
    const internal: Scripted = { status: 500, body: { error: 'internal', message: 'The job could not be submitted because of an internal error' } };
    const { client, sent, clock } = api([internal, internal, internal, 'lost', internal], () => 1);
    const error = (await client.submit({ pipeline: 'canary', input: {}, idempotencyKey: 'same' }).catch((caught: unknown) => caught)) as PhaselineApiError;
    expect([error.status, error.code, error.attempts, error.retryable]).toEqual([500, 'internal', 5, true]);
    expect(new Set(sent.map((request) => request.headers['idempotency-key']))).toEqual(new Set(['same']));
    expect(clock.slept).toEqual([400, 800, 1_600, 3_200]);
  });

  it('stops retrying when aborted: no try after the abort', async () => {
    const controller = new AbortController();
    const { fetch, sent } = scriptedFetch(['lost', accepted('never')]);
    const clock: RetryClock = {
      now: () => NOW,
      sleep: () => {
        controller.abort(new Error('the person left the page'));
        return Promise.reject(new Error('aborted'));
      },
    };
    const client = createPhaselineApi({ functionsBaseUrl: 'http://f', idToken: () => Promise.resolve('t'), fetch, clock });
    const error = (await client.submit({ pipeline: 'canary', input: {} }, { signal: controller.signal }).catch((caught: unknown) => caught)) as PhaselineApiError;
    expect([error.code, error.retryable]).toEqual(['aborted', false]);
    expect(sent).toHaveLength(1);
  });

  it('refuses an accepted answer that names no job', async () => {
    const { client } = api([{ status: 202, body: { status: 'queued' } }]);
    await expect(client.submit({ pipeline: 'canary', input: {} })).rejects.toMatchObject({ code: 'bad_answer', message: 'submitJob answered without a taskId' });
  });
});

describe('cancel and answer', () => {
  it('cancel posts the job and reason and reads the report', async () => {
    const { client, sent } = api([{ status: 200, body: { jobId: 'j', status: 'cancelled', unknownEffects: 1, report: 'Cancelled by its owner during send.' } }]);
    await expect(client.cancel('j', 'changed my mind')).resolves.toEqual({ jobId: 'j', status: 'cancelled', unknownEffects: 1, report: 'Cancelled by its owner during send.' });
    expect(sent.map((request) => [request.url, request.body])).toEqual([['http://functions.test/demo/us-central1/cancelJob', { jobId: 'j', reason: 'changed my mind' }]]);
    expect(sent[0]?.headers['idempotency-key']).toBeUndefined();
  });

  it('a cancel of a job that already ended is a 409, not retried', async () => {
    const { client, sent } = api([{ status: 409, body: { error: 'conflict', message: 'Job j is already completed' } }]);
    await expect(client.cancel('j')).rejects.toMatchObject({ status: 409, code: 'conflict', message: 'Job j is already completed' });
    expect(sent[0]?.body).toEqual({ jobId: 'j' });
  });

  it('answer posts to decideJob and retries a 503', async () => {
    const { client, sent, clock } = api([{ status: 503, body: { error: 'unavailable', message: 'later' }, headers: { 'Retry-After': '1' } }, { status: 200, body: { jobId: 'j', status: 'queued' } }]);
    await expect(client.answer('j', 'depth', 'In depth')).resolves.toEqual({ jobId: 'j', status: 'queued' });
    expect(sent.map((request) => [request.url.split('/').at(-1), request.body])).toEqual([
      ['decideJob', { jobId: 'j', questionId: 'depth', answer: 'In depth' }],
      ['decideJob', { jobId: 'j', questionId: 'depth', answer: 'In depth' }],
    ]);
    expect(clock.slept).toEqual([1_000]);
  });

  it('a refused answer (not one of the options) is a 400 with the server\'s sentence', async () => {
    const { client } = api([{ status: 400, body: { error: 'invalid_request', message: '"Maybe" is not one of the options: "Short overview", "In depth"' } }]);
    await expect(client.answer('j', 'depth', 'Maybe')).rejects.toMatchObject({ status: 400, message: '"Maybe" is not one of the options: "Short overview", "In depth"' });
  });
});

describe('snapshot decoding', () => {
  const timestamp = (ms: number) => ({ toMillis: () => ms });
  const waitingJob = (reason: string, extra: Record<string, unknown> = {}) =>
    readJob('j1', {
      status: 'waiting',
      pipeline: 'research',
      phase: 'outline',
      step: 4,
      epoch: 2,
      owner: 'u1',
      input: { question: 'How deep?' },
      waiting: { reason, questionId: 'depth', question: 'How deep should it go?', options: ['Short', 'Long'], until: null, ...extra },
      createdAt: timestamp(NOW),
    });

  it('reads a job document as the engine writes it', () => {
    const job = readJob('j1', {
      status: 'completed',
      outcome: 'partial',
      pipeline: 'research',
      phase: 'final-document',
      conversationId: 'c1',
      attempts: 1,
      staleReclaims: 2,
      epoch: 3,
      step: 9,
      progress: { sectionsTotal: 3, documentSectionsDone: 3, junk: 'x' },
      cost: { spentUsd: 0.002, modelCalls: 7 },
      lastError: { code: 'provider_overloaded', message: 'overloaded', retryable: true },
      createdAt: timestamp(NOW),
      finishedAt: NOW + 5_000,
    });
    expect(job).toMatchObject({
      id: 'j1',
      status: 'completed',
      outcome: 'partial',
      conversationId: 'c1',
      attempts: 1,
      staleReclaims: 2,
      epoch: 3,
      step: 9,
      progress: { sectionsTotal: 3, documentSectionsDone: 3 },
      cost: { spentUsd: 0.002, modelCalls: 7 },
      lastError: { code: 'provider_overloaded', message: 'overloaded', retryable: true },
      createdAtMs: NOW,
      finishedAtMs: NOW + 5_000,
      waiting: null,
    });
    expect(job.progress).not.toHaveProperty('junk');
  });

  it('never throws on a document it does not expect', () => {
    expect(readJob('odd', 'not an object')).toMatchObject({ id: 'odd', status: 'unknown', pipeline: '?', phase: null, epoch: 0, waiting: null });
    expect(readJob('odd', { status: 'exploded' }).status).toBe('unknown');
    expect(readResult({ title: 'no markdown' })).toBeNull();
    expect(readResult({ title: 'T', markdown: '# T', outcome: 'complete', missing: ['x', 3] })).toEqual({ title: 'T', markdown: '# T', outcome: 'complete', missing: ['x'] });
  });

  it('a decision or a spend-limit wait is a question for the owner; a provider wait is not', () => {
    expect(questionOf(waitingJob('decision'))).toEqual({ jobId: 'j1', questionId: 'depth', question: 'How deep should it go?', options: ['Short', 'Long'], reason: 'decision', step: 4, untilMs: null });
    expect(questionOf(waitingJob('budget', { until: timestamp(NOW + 60_000) }))).toMatchObject({ reason: 'budget', untilMs: NOW + 60_000 });
    expect(questionOf(waitingJob('provider'))).toBeNull();
    expect(questionOf({ ...waitingJob('decision'), status: 'queued' })).toBeNull();
  });

  it('drafts in flight: the current phase, unfinished, from the latest claim of the job or its unit', () => {
    const draft = (phase: string, unit: string | null, id: string, epoch: number, text = 'words') => readDraft({ phase, unit, id, text, epoch, updatedAtMs: NOW });
    const job = { status: 'running' as const, phase: 'expert-content', epoch: 5 };
    const sections = [readSection({ phase: 'expert-content', unit: 'e1', id: 'h1', seq: 0, data: { text: 'done' } })];
    const drafts = [
      draft('expert-content', 'e1', 'h1', 3), // recorded already
      draft('expert-content', 'e1', 'h2', 3), // the unit's current claim
      draft('expert-content', 'e2', 'h1', 1), // the unit was reclaimed since: a lost worker's text
      draft('expert-content', 'e2', 'h10', 2),
      draft('expert-content', 'e2', 'h2', 2, '   '), // nothing written yet
      draft('outline', null, 'o', 5), // another phase
    ];
    const writing = draftsInFlight(job, sections, drafts, [{ unit: 'e1', epoch: 3 }, { unit: 'e2', epoch: 2 }]);
    expect(writing.map((entry) => `${entry.unit ?? ''}/${entry.id}`)).toEqual(['e1/h2', 'e2/h10']);
    expect(draftsInFlight({ ...job, status: 'waiting' }, sections, drafts, [])).toEqual([]);
  });

  it('a snapshot has ended once the job is terminal and, when completed, its answer is read', () => {
    const base = emptySnapshot('j1');
    const completed = readJob('j1', { status: 'completed', outcome: 'complete' });
    expect(deriveSnapshot(base)).toMatchObject({ job: null, ended: false, question: null, writing: [] });
    expect(deriveSnapshot({ ...base, job: completed }).ended).toBe(false);
    expect(deriveSnapshot({ ...base, job: completed, result: { title: 'T', markdown: '# T', outcome: 'complete', missing: [] } }).ended).toBe(true);
    expect(deriveSnapshot({ ...base, job: readJob('j1', { status: 'cancelled', cancellation: { reason: 'r', phase: null, sectionsDone: null, effects: null } }) }).ended).toBe(true);
    expect(deriveSnapshot({ ...base, job: waitingJob('decision') })).toMatchObject({ ended: false, question: { questionId: 'depth' } });
  });
});
