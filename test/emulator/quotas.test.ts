/**
 * Limits per user at submit, on the official Firestore emulator through the real HTTP handler:
 * jobs in flight, submissions per minute, the anonymous defaults, the operator's override, a
 * retry with the same Idempotency-Key (never refused, never counted twice), an ended job giving
 * its slot back, and parallel submits racing for the last slots. The clock is a ManualClock.
 * Also the exported submitJob trigger (its token reading and env defaults), the CLI's `limits`
 * command and `submit`'s message on a 429.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { z } from 'zod';
import { ManualClock } from '../../functions/src/core/clock';
import type { JobStatus } from '../../functions/src/core/job';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { definePhase, definePipeline, PIPELINE_GRANTS_CLAIM, pipelineRegistry } from '../../functions/src/core/pipeline';
import { nextSpendResetMs, spendDay, type QuotaDefaults } from '../../functions/src/core/quota';
import { submitJob as submitJobTrigger } from '../../functions/src/index';
import type { HttpRequest, HttpResponse } from '../../functions/src/http/request';
import { createSubmitHandler, type SubmitHandlerDeps } from '../../functions/src/http/submit-handler';
import { createNotifyPipeline, NOTIFY_PIPELINE } from '../../functions/src/pipelines/notify';
import { JobStore } from '../../functions/src/store/job-store';
import { ANONYMOUS_TOTAL_PATH, quotaUsagePath, spendDayPath, userLimitsPath } from '../../functions/src/store/paths';
import { SubmitQuota } from '../../functions/src/store/quota-documents';
import { provideBackends } from '../../functions/src/triggers/admin';
import { parseInvocation, type Command } from '../../scripts/cli/args';
import { functionsClient } from '../../scripts/cli/functions-client';
import { bufferedIo } from '../../scripts/cli/io';
import { guarded } from '../../scripts/cli/main';
import { limits, type OperatorContext } from '../../scripts/cli/operator-commands';
import type { LocalTarget } from '../../scripts/cli/target';
import { submit as cliSubmit, type UserContext } from '../../scripts/cli/user-commands';
import { openTestFirestore, type TestFirestore } from '../support/firestore';
import { afterEveryGetAll, whileInterposed } from '../support/interpose';
import { RecordingTaskQueue } from '../support/task-queue';
import { RecordingResponse } from '../support/http';

const echoInput = z.strictObject({ text: z.string().min(1) });
const echo = definePipeline<z.infer<typeof echoInput>>({
  name: 'echo',
  description: 'Repeats its text once',
  input: echoInput,
  phases: [
    definePhase<z.infer<typeof echoInput>, { text: string }>({
      name: 'repeat',
      state: z.object({ text: z.string() }),
      run: (context) => Promise.resolve({ kind: 'done', state: { text: context.input.text } }),
    }),
  ],
  publish: () => ({ outcome: 'complete', title: 'Echo', markdown: '', missing: [] }),
});

/** Signed in: 3 in flight, 5 a minute; anonymous: 1 in flight, 2 a minute. */
const LIMITS: QuotaDefaults = { signedIn: { jobsInFlight: 3, submitsPerMinute: 5, spendUsdPerDay: 10 }, anonymous: { jobsInFlight: 1, submitsPerMinute: 2, spendUsdPerDay: 1 } };
/** For the per-minute tests: in flight never binds. */
const RATE_ONLY: QuotaDefaults = { signedIn: { jobsInFlight: 100, submitsPerMinute: 3, spendUsdPerDay: 10 }, anonymous: { jobsInFlight: 100, submitsPerMinute: 2, spendUsdPerDay: 1 } };

/**
 * `token-<name>` is signed-in user `uid-<name>`; `anon-<name>` is anonymous user `uid-<name>`;
 * `granted-<name>` is signed-in user `uid-<name>` whom an operator granted the notify pipeline.
 */
const verifyToken: SubmitHandlerDeps['verifyToken'] = (token) => {
  const match = /^(token|anon|granted)-([a-z0-9]+)$/.exec(token);
  if (!match) return Promise.reject(new Error('Firebase ID token has expired'));
  const claims = match[1] === 'granted' ? { [PIPELINE_GRANTS_CLAIM]: [NOTIFY_PIPELINE] } : {};
  return Promise.resolve({ uid: `uid-${match[2] ?? ''}`, signInProvider: match[1] === 'anon' ? 'anonymous' : 'password', claims });
};

/** The deployed notify pipeline; a submit never runs it, so it needs no receiver. */
const notify = createNotifyPipeline(() => {
  throw new Error('no notify step runs in these tests');
});

class FakeResponse extends RecordingResponse {
  get taskId(): string {
    return z.object({ taskId: z.string() }).parse(this.body).taskId;
  }
}

interface SubmitShape {
  readonly token?: string;
  readonly key?: string;
  readonly text?: string;
  /** Another body than echo's with `text`. */
  readonly body?: unknown;
}

function request({ token = 'token-alice', key, text = 'hello', body = { pipeline: 'echo', input: { text } } }: SubmitShape = {}): HttpRequest {
  const headers = new Map<string, string>([
    ['authorization', `Bearer ${token}`],
    ['content-type', 'application/json'],
  ]);
  if (key !== undefined) headers.set('idempotency-key', key);
  return { method: 'POST', get: (name) => headers.get(name.toLowerCase()), body, rawBody: Buffer.from(JSON.stringify(body)) };
}

let firestore: TestFirestore;
let clock: ManualClock;
let queue: RecordingTaskQueue;
let store: JobStore;
let handle: (request: HttpRequest, response: HttpResponse) => Promise<void>;

function useLimits(defaults: QuotaDefaults): void {
  handle = createSubmitHandler({ store, queue, verifyToken, pipelines: pipelineRegistry(echo, notify), logger: { warn: () => undefined, error: () => undefined }, quota: new SubmitQuota(firestore.db, defaults) });
}

async function submit(shape: SubmitShape = {}): Promise<FakeResponse> {
  const response = new FakeResponse();
  await handle(request(shape), response);
  return response;
}

async function submitMany(count: number, shape: SubmitShape = {}): Promise<FakeResponse[]> {
  const answers: FakeResponse[] = [];
  for (let index = 0; index < count; index += 1) answers.push(await submit({ ...shape, text: `job ${index}` }));
  return answers;
}

const statuses = (answers: readonly FakeResponse[]): (number | undefined)[] => answers.map((answer) => answer.statusCode);

async function jobsOf(uid: string): Promise<number> {
  return (await firestore.db.collection('jobs').where('owner', '==', uid).get()).size;
}

async function usageOf(uid: string): Promise<{ inFlightJobIds: string[]; recentSubmitsAtMs: number[] }> {
  const snapshot = await firestore.db.doc(quotaUsagePath(uid)).get();
  return { inFlightJobIds: (snapshot.get('inFlightJobIds') as string[] | undefined) ?? [], recentSubmitsAtMs: (snapshot.get('recentSubmitsAtMs') as number[] | undefined) ?? [] };
}

async function setStatus(jobId: string, status: JobStatus): Promise<void> {
  await store.jobRef(jobId).update({ status });
}

beforeAll(() => {
  firestore = openTestFirestore('quotas');
});
beforeEach(async () => {
  await firestore.reset();
  clock = new ManualClock();
  queue = new RecordingTaskQueue();
  store = new JobStore(firestore.db, clock, resolveEngineOptions());
  useLimits(LIMITS);
});
afterAll(() => firestore.close());

describe('jobs in flight', () => {
  test('the fourth job of a user with three in flight is refused with a 429 that names the limit; nothing is written', async () => {
    expect(statuses(await submitMany(3))).toEqual([202, 202, 202]);
    const refused = await submit({ text: 'one too many' });

    expect(refused.statusCode).toBe(429);
    expect(refused.headers.get('retry-after')).toBe('30');
    expect(refused.body).toEqual({
      error: 'quota_exceeded',
      limit: 'jobs_in_flight',
      allowed: 3,
      retryAfterSeconds: 30,
      message: 'You have 3 jobs in progress, the most allowed at once; try again when one finishes.',
    });
    expect(await jobsOf('uid-alice')).toBe(3);
    expect(queue.tasks).toHaveLength(3);
    expect((await usageOf('uid-alice')).inFlightJobIds).toHaveLength(3);
  });

  test('the limit is per user: another user still submits', async () => {
    await submitMany(3);
    expect((await submit({ token: 'token-bob' })).statusCode).toBe(202);
  });

  test.each<JobStatus>(['completed', 'failed', 'cancelled'])('a %s job gives its slot back at the next submit', async (ended) => {
    const [first] = await submitMany(3);
    await setStatus(first?.taskId ?? '', ended);

    const accepted = await submit({ text: 'after one ended' });
    expect(accepted.statusCode).toBe(202);
    expect((await usageOf('uid-alice')).inFlightJobIds).not.toContain(first?.taskId);
    expect((await usageOf('uid-alice')).inFlightJobIds).toContain(accepted.taskId);
    expect((await submit({ text: 'and no more' })).statusCode).toBe(429);
  });

  test.each<JobStatus>(['running', 'waiting', 'queued'])('a %s job keeps its slot', async (status) => {
    const [first] = await submitMany(3);
    await setStatus(first?.taskId ?? '', status);
    expect((await submit({ text: 'still full' })).statusCode).toBe(429);
  });

  test('a quarantined job gives its slot back: it runs no more by itself and its owner cannot cancel it', async () => {
    const [first] = await submitMany(3);
    await setStatus(first?.taskId ?? '', 'quarantined');
    expect((await submit({ text: 'after a quarantine' })).statusCode).toBe(202);
  });

  test("bug 27: a listed job whose document cannot be read does not fail its owner's submits: its status alone decides its slot", async () => {
    const [first, second] = await submitMany(3);
    // One broken field (the codec refuses it); one job still in flight by its status, the other quarantined as an unreadable job is.
    await store.jobRef(first?.taskId ?? '').update({ attempts: 'many' });
    await store.jobRef(second?.taskId ?? '').update({ attempts: 'many', status: 'quarantined' });
    expect((await submit({ text: 'after the breakage' })).statusCode).toBe(202);
    expect((await submit({ text: 'and no more' })).statusCode).toBe(429);
  });

  test('a listed job that no longer exists holds no slot', async () => {
    const [first] = await submitMany(3);
    await store.jobRef(first?.taskId ?? '').delete();
    expect((await submit({ text: 'after a deletion' })).statusCode).toBe(202);
  });
});

describe('submits per minute', () => {
  beforeEach(() => useLimits(RATE_ONLY));

  test('past the limit in 60 s the answer is 429, Retry-After counting until the oldest leaves the window', async () => {
    const startMs = clock.now();
    for (const offsetSeconds of [0, 5, 10]) {
      clock.set(startMs + offsetSeconds * 1000);
      expect((await submit({ text: `at ${offsetSeconds}` })).statusCode).toBe(202);
    }
    clock.set(startMs + 20_000);
    const refused = await submit({ text: 'at 20' });

    expect(refused.statusCode).toBe(429);
    expect(refused.headers.get('retry-after')).toBe('40');
    expect(refused.body).toEqual({
      error: 'quota_exceeded',
      limit: 'submits_per_minute',
      allowed: 3,
      retryAfterSeconds: 40,
      message: 'You have submitted 3 jobs in the last minute, the most allowed; try again in 40 seconds.',
    });
    expect(await jobsOf('uid-alice')).toBe(3);

    clock.set(startMs + 60_000);
    expect((await submit({ text: 'at 60, the oldest has just left' })).statusCode).toBe(202);
    expect((await submit({ text: 'at 60, again' })).statusCode).toBe(429);
    expect((await usageOf('uid-alice')).recentSubmitsAtMs).toEqual([startMs + 5_000, startMs + 10_000, startMs + 60_000]);
  });

  test('a refused submit does not count against the window', async () => {
    const startMs = clock.now();
    await submitMany(3);
    clock.set(startMs + 30_000);
    expect(statuses(await submitMany(4))).toEqual([429, 429, 429, 429]);
    clock.set(startMs + 60_001);
    expect(statuses(await submitMany(3))).toEqual([202, 202, 202]);
  });
});

describe('model spend per day', () => {
  const spendToday = (uid: string, usd: number) => firestore.db.doc(spendDayPath(uid, spendDay(clock.now()))).set({ usd });

  test("a user whose spend today reached the cap is refused until the day's end; nothing is written", async () => {
    await spendToday('uid-alice', 10);
    const refused = await submit();
    const untilMidnight = Math.ceil((nextSpendResetMs(clock.now()) - clock.now()) / 1000);
    expect(refused.statusCode).toBe(429);
    expect(refused.headers.get('retry-after')).toBe(String(untilMidnight));
    expect(refused.body).toMatchObject({ error: 'quota_exceeded', limit: 'spend_per_day', allowed: 10, retryAfterSeconds: untilMidnight });
    expect((refused.body as { message: string }).message).toMatch(/^Today's model spend of \$10\.00 reached this account's daily limit of \$10\.00; it resets at \d{4}-\d\d-\d\d 00:00 UTC\.$/);
    expect(await jobsOf('uid-alice')).toBe(0);
    expect(queue.tasks).toHaveLength(0);
  });

  test('under the cap a submit is accepted, and the kind of account is recorded for the steps to pick the cap', async () => {
    await spendToday('uid-alice', 9.99);
    expect((await submit()).statusCode).toBe(202);
    expect((await firestore.db.doc(quotaUsagePath('uid-alice')).get()).get('anonymous')).toBe(false);
    expect((await submit({ token: 'anon-carol' })).statusCode).toBe(202);
    expect((await firestore.db.doc(quotaUsagePath('uid-carol')).get()).get('anonymous')).toBe(true);
  });

  test('anonymous accounts have the lower cap; an operator raises one user\'s', async () => {
    await spendToday('uid-carol', 1);
    await spendToday('uid-dave', 1);
    expect((await submit({ token: 'anon-carol' })).body).toMatchObject({ limit: 'spend_per_day', allowed: 1 });
    expect((await submit({ token: 'token-dave' })).statusCode).toBe(202);
    await firestore.db.doc(userLimitsPath('uid-carol')).set({ spendUsdPerDay: 5 });
    expect((await submit({ token: 'anon-carol' })).statusCode).toBe(202);
  });

  test("yesterday's spend does not count today", async () => {
    await firestore.db.doc(spendDayPath('uid-alice', spendDay(clock.now() - 86_400_000))).set({ usd: 500 });
    expect((await submit()).statusCode).toBe(202);
  });
});

describe('anonymous accounts', () => {
  test('get their own, lower defaults: one job in flight', async () => {
    expect((await submit({ token: 'anon-carol' })).statusCode).toBe(202);
    const refused = await submit({ token: 'anon-carol', text: 'second' });
    expect(refused.statusCode).toBe(429);
    expect(refused.body).toMatchObject({ limit: 'jobs_in_flight', allowed: 1, message: 'You have 1 job in progress, the most allowed at once; try again when one finishes.' });
    // A signed-in user at the same moment has the signed-in limit.
    expect(statuses(await submitMany(3, { token: 'token-dave' }))).toEqual([202, 202, 202]);
  });

  test('and two submits a minute', async () => {
    useLimits(RATE_ONLY);
    expect(statuses(await submitMany(3, { token: 'anon-carol' }))).toEqual([202, 202, 429]);
  });
});

describe("an operator's userLimits/{uid} document", () => {
  test('raises one limit of one user; the others keep the defaults', async () => {
    await firestore.db.doc(userLimitsPath('uid-alice')).set({ jobsInFlight: 5 });
    expect(statuses(await submitMany(6))).toEqual([202, 202, 202, 202, 202, 429]);
    // A minute later the rate window is empty, but five are still in flight.
    clock.advance(60_001);
    expect(statuses(await submitMany(1))).toEqual([429]);
    expect(statuses(await submitMany(4, { token: 'token-bob' }))).toEqual([202, 202, 202, 429]);
  });

  test("applies to an anonymous account too, and can lower a limit to 0, with a sentence that says so", async () => {
    await firestore.db.doc(userLimitsPath('uid-carol')).set({ jobsInFlight: 2 });
    expect(statuses(await submitMany(3, { token: 'anon-carol' }))).toEqual([202, 202, 429]);
    await firestore.db.doc(userLimitsPath('uid-bob')).set({ jobsInFlight: 0 });
    const refused = await submit({ token: 'token-bob' });
    expect(refused.body).toMatchObject({ limit: 'jobs_in_flight', allowed: 0, message: expect.stringMatching(/may not run jobs at the moment .* ask an operator/) as unknown });
  });

  test('a malformed one is an internal error (500), not a silent default', async () => {
    await firestore.db.doc(userLimitsPath('uid-alice')).set({ jobsInFlight: 'lots' });
    const answer = await submit();
    expect(answer.statusCode).toBe(500);
    expect(await jobsOf('uid-alice')).toBe(0);
  });
});

describe('a retry with the same Idempotency-Key', () => {
  test('finds the first job even at the limit, and is not counted again', async () => {
    const first = await submit({ key: 'first' });
    await submitMany(2);
    const usageBefore = await usageOf('uid-alice');
    expect(usageBefore.inFlightJobIds).toHaveLength(3);

    const retried = await submit({ key: 'first' });
    expect(retried.statusCode).toBe(202);
    expect(retried.headers.get('idempotent-replayed')).toBe('true');
    expect(retried.taskId).toBe(first.taskId);
    expect(await usageOf('uid-alice')).toEqual(usageBefore);
    expect(await jobsOf('uid-alice')).toBe(3);
    expect(queue.tasks).toHaveLength(3);
    expect((await submit({ key: 'a new one' })).statusCode).toBe(429);
  });

  test('is not refused by the per-minute limit either', async () => {
    useLimits(RATE_ONLY);
    const first = await submit({ key: 'first' });
    await submitMany(2);
    const retried = await submit({ key: 'first' });
    expect([retried.statusCode, retried.taskId]).toEqual([202, first.taskId]);
    expect((await usageOf('uid-alice')).recentSubmitsAtMs).toHaveLength(3);
  });

  test('of a submission that was refused is judged afresh: accepted once a slot is free', async () => {
    const [first] = await submitMany(3);
    expect((await submit({ key: 'later' })).statusCode).toBe(429);
    await setStatus(first?.taskId ?? '', 'completed');
    const accepted = await submit({ key: 'later' });
    expect(accepted.statusCode).toBe(202);
    expect(accepted.headers.get('idempotent-replayed')).toBeUndefined();
  });
});

describe('parallel submits race for the last slots', () => {
  test('10 at once against 3 jobs in flight: exactly 3 accepted', async () => {
    const answers = await Promise.all(Array.from({ length: 10 }, (_, index) => submit({ key: `race-${index}`, text: `race ${index}` })));
    expect(statuses(answers).filter((status) => status === 202)).toHaveLength(3);
    expect(statuses(answers).filter((status) => status === 429)).toHaveLength(7);
    expect(await jobsOf('uid-alice')).toBe(3);
    expect((await usageOf('uid-alice')).inFlightJobIds.sort()).toEqual(answers.filter((answer) => answer.statusCode === 202).map((answer) => answer.taskId).sort());
  });

  test('10 at once against 3 submits a minute: exactly 3 accepted', async () => {
    useLimits(RATE_ONLY);
    const answers = await Promise.all(Array.from({ length: 10 }, (_, index) => submit({ text: `race ${index}` })));
    expect(statuses(answers).filter((status) => status === 202)).toHaveLength(3);
    expect(statuses(answers).filter((status) => status === 429)).toHaveLength(7);
    expect(await jobsOf('uid-alice')).toBe(3);
    expect((await usageOf('uid-alice')).recentSubmitsAtMs).toHaveLength(3);
  });
});

describe('who may run a pipeline', () => {
  const fiveHundred = { pipeline: 'notify', input: { campaign: 'Renewals', recipients: 500, subject: 'Act now', template: 'Click here, {name}' } };

  test('bug 29: notify is refused (403) to an anonymous account and to a signed-in one without the grant, before its input is read; nothing is written', async () => {
    const anonymous = await submit({ token: 'anon-mallory', body: fiveHundred });
    expect(anonymous.statusCode).toBe(403);
    expect(anonymous.body).toMatchObject({ error: 'forbidden', message: expect.stringMatching(/not open to guest \(anonymous\) accounts/) as unknown });
    const ungranted = await submit({ token: 'token-mallory', body: fiveHundred });
    expect(ungranted.statusCode).toBe(403);
    expect(ungranted.body).toMatchObject({ message: expect.stringMatching(/needs an operator's grant[\s\S]*phaseline admin allow uid-mallory notify/) as unknown });
    // The refusal comes first: even a body notify's schema would refuse says only that.
    expect((await submit({ token: 'anon-mallory', body: { pipeline: 'notify', input: {} } })).statusCode).toBe(403);
    expect(await jobsOf('uid-mallory')).toBe(0);
    expect(queue.tasks).toEqual([]);
    expect((await firestore.db.doc(quotaUsagePath('uid-mallory')).get()).exists).toBe(false);
  });

  test('bug 29: an account an operator granted notify submits it; pipelines without a policy stay open to anonymous accounts', async () => {
    expect((await submit({ token: 'granted-ops', body: fiveHundred })).statusCode).toBe(202);
    expect((await submit({ token: 'anon-carol' })).statusCode).toBe(202);
  });
});

describe('the ceiling on anonymous jobs in flight, all anonymous accounts together', () => {
  const CEILING: QuotaDefaults = { ...LIMITS, anonymousJobsInFlightTotal: 5 };
  const freshAccounts = (count: number) => Array.from({ length: count }, (_, index) => `anon-fresh${index}`);
  const listed = async (): Promise<string[]> => ((await firestore.db.doc(ANONYMOUS_TOTAL_PATH).get()).get('inFlightJobIds') as string[] | undefined) ?? [];

  test('bug 29: twenty fresh anonymous accounts submitting research at once: exactly the ceiling is admitted, the rest get 429 with Retry-After', async () => {
    useLimits(CEILING);
    const answers = await Promise.all(freshAccounts(20).map((token) => submit({ token, text: `a full research job from ${token}` })));
    const accepted = answers.filter((answer) => answer.statusCode === 202);
    const refused = answers.filter((answer) => answer.statusCode === 429);
    expect([accepted.length, refused.length]).toEqual([5, 15]);
    for (const answer of refused) {
      expect(answer.headers.get('retry-after')).toBe('30');
      expect(answer.body).toMatchObject({ error: 'quota_exceeded', limit: 'anonymous_jobs_in_flight', allowed: 5, message: expect.stringMatching(/sign in to submit now/) as unknown });
    }
    expect((await firestore.db.collection('jobs').get()).size).toBe(5);
    expect((await listed()).sort()).toEqual(accepted.map((answer) => answer.taskId).sort());
    // Signed-in accounts are not counted against it.
    expect((await submit({ token: 'token-dave' })).statusCode).toBe(202);
  });

  test('bug 29: a slot comes back when its job ends (read at the next anonymous submit that finds the ceiling full)', async () => {
    useLimits(CEILING);
    const accepted = [];
    for (const token of freshAccounts(5)) accepted.push(await submit({ token }));
    expect(statuses(accepted)).toEqual([202, 202, 202, 202, 202]);
    expect((await submit({ token: 'anon-late' })).body).toMatchObject({ limit: 'anonymous_jobs_in_flight' });
    await setStatus(accepted[0]?.taskId ?? '', 'completed');
    const admitted = await submit({ token: 'anon-late' });
    expect(admitted.statusCode).toBe(202);
    expect(await listed()).not.toContain(accepted[0]?.taskId);
    expect(await listed()).toContain(admitted.taskId);
    expect((await submit({ token: 'anon-later' })).statusCode).toBe(429);
  });

  test('a ceiling of 0 keeps anonymous accounts from running jobs, with a sentence that says so', async () => {
    useLimits({ ...LIMITS, anonymousJobsInFlightTotal: 0 });
    expect((await submit({ token: 'anon-carol' })).body).toMatchObject({ limit: 'anonymous_jobs_in_flight', allowed: 0, message: expect.stringMatching(/may not run jobs at the moment/) as unknown });
  });
});

describe('a submit that keeps losing the race for its usage document', () => {
  test('bug 37: is answered 503 with Retry-After once its commit attempts run out, never 500; nothing is written', async () => {
    // Every read of alice's usage is followed by a change to it (as an operator's limits change makes), so every commit finds it changed.
    let changes = 0;
    const interposed = afterEveryGetAll(firestore.db, (paths) => paths.includes(quotaUsagePath('uid-alice')), async () => {
      changes += 1;
      await firestore.db.doc(quotaUsagePath('uid-alice')).set({ inFlightJobIds: [], recentSubmitsAtMs: [], updatedAtMs: 0, limitsChangedAtMs: changes });
    });
    const answer: FakeResponse = await whileInterposed(interposed, () => submit({ key: 'contended' }));
    expect(interposed.times()).toBeGreaterThan(1);
    expect(answer.statusCode).toBe(503);
    expect(Number(answer.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(answer.body).toMatchObject({ error: 'contended', retryAfterSeconds: Number(answer.headers.get('retry-after')) });
    expect(z.object({ message: z.string() }).parse(answer.body).message).toMatch(/same Idempotency-Key/);
    expect(await jobsOf('uid-alice')).toBe(0);
    // Once the race is over, the same request goes through.
    expect((await submit({ key: 'contended' })).statusCode).toBe(202);
  });
});

describe('the CLI', () => {
  const io = () => bufferedIo();
  function operator(out: ReturnType<typeof bufferedIo>): OperatorContext {
    const target: LocalTarget = {
      kind: 'local',
      projectId: firestore.projectId,
      region: 'us-central1',
      hosts: { firestore: '127.0.0.1:1', functions: '127.0.0.1:1', auth: '127.0.0.1:1', tasks: '127.0.0.1:1' },
      firestoreUrl: 'http://127.0.0.1:1/v1',
      functionsUrl: 'http://127.0.0.1:1',
    };
    return { target, io: out, store, queue, now: () => clock.now(), time: {}, close: () => Promise.resolve() };
  }
  const limitsCommand = (...argv: string[]) => parseInvocation(['limits', ...argv]).command as Extract<Command, { name: 'limits' }>;

  test('`phaseline limits <uid> --jobs-in-flight 10` writes the override the submit reads; --reset removes it', async () => {
    const out = io();
    expect(await limits(operator(out), limitsCommand('uid-alice', '--jobs-in-flight', '4'), LIMITS)).toBe(0);
    expect(out.stdout).toEqual([
      'Limits of uid-alice (userLimits/uid-alice):',
      '  jobs in flight      4 (set by an operator)',
      '  submits per minute  default: 5 signed in, 2 anonymous',
      '  USD per day         default: 10 signed in, 1 anonymous',
    ]);
    expect((await firestore.db.doc(userLimitsPath('uid-alice')).get()).data()).toEqual({ jobsInFlight: 4, updatedAtMs: clock.now() });
    // Copied into today's and tomorrow's spend days, which the steps read before every model call (no read of userLimits per call).
    const spendDays = [clock.now(), clock.now() + 86_400_000].map((dayMs) => firestore.db.doc(spendDayPath('uid-alice', spendDay(dayMs))));
    for (const day of spendDays) expect((await day.get()).data()).toMatchObject({ limits: { jobsInFlight: 4, updatedAtMs: clock.now() } });
    // The spend is left alone: a day with only the copy has no usd yet.
    expect((await spendDays[0]!.get()).get('usd')).toBeUndefined();
    expect(statuses(await submitMany(5))).toEqual([202, 202, 202, 202, 429]);

    expect(await limits(operator(io()), limitsCommand('uid-alice', '--reset'), LIMITS)).toBe(0);
    expect((await firestore.db.doc(userLimitsPath('uid-alice')).get()).exists).toBe(false);
    for (const day of spendDays) expect((await day.get()).get('limits')).toBeNull();
  });

  test('`limits` refuses a value out of range before anything is written', () => {
    expect(() => limitsCommand('uid-alice', '--jobs-in-flight', '101')).toThrow('--jobs-in-flight must be a whole number from 0 to 100, or "default", not "101"');
    expect(limitsCommand('uid-alice', '--submits-per-minute', 'default').change).toEqual({ submitsPerMinute: null });
    expect(limitsCommand('uid-alice', '--spend-usd-per-day', '12.50').change).toEqual({ spendUsdPerDay: 12.5 });
    expect(() => limitsCommand('uid-alice', '--spend-usd-per-day', '1.005')).toThrow('--spend-usd-per-day must be an amount in USD from 0 to 1000000 with at most two decimals, or "default", not "1.005"');
    expect(limitsCommand('uid-alice', '--reset').change).toEqual({ jobsInFlight: null, submitsPerMinute: null, spendUsdPerDay: null });
  });

  test('`phaseline submit` prints the sentence of a 429', async () => {
    await submitMany(3);
    // The CLI's own HTTP client, its fetch answered by the handler in this process.
    const doFetch = (async (_url: string, init: { headers: Record<string, string>; body: string }) => {
      const headers = new Map(Object.entries(init.headers).map(([name, value]) => [name.toLowerCase(), value]));
      const response = new FakeResponse();
      await handle({ method: 'POST', get: (name) => headers.get(name.toLowerCase()), rawBody: Buffer.from(init.body) }, response);
      return new Response(JSON.stringify(response.body), { status: response.statusCode ?? 500, headers: Object.fromEntries(response.headers) });
    }) as unknown as typeof fetch;
    const target = operator(io()).target;
    const identity = () => Promise.resolve({ uid: 'uid-alice', idToken: 'token-alice' });
    const out = io();
    const ctx = { target, io: out, identity, functions: functionsClient(target, identity, doFetch) } as unknown as UserContext;
    const command = parseInvocation(['submit', 'echo', '{"text": "one more"}']).command as Extract<Command, { name: 'submit' }>;

    expect(await guarded(out, () => cliSubmit(ctx, command))).toBe(1);
    expect(out.stderr.join('\n')).toContain('You have 3 jobs in progress, the most allowed at once; try again when one finishes.');
  });
});

describe('the exported submitJob trigger', () => {
  /** An unsigned Firebase ID token, as the Auth emulator issues them and the admin SDK accepts them under it. */
  function idToken(uid: string, signInProvider: string): string {
    const part = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64url');
    const now = Math.floor(Date.now() / 1000);
    const iss = `https://securetoken.google.com/${firestore.projectId}`;
    const claims = { iss, aud: firestore.projectId, iat: now, exp: now + 3600, auth_time: now, sub: uid, user_id: uid, firebase: { sign_in_provider: signInProvider, identities: {} } };
    return `${part({ alg: 'none', typ: 'JWT' })}.${part(claims)}.`;
  }

  test("reads the token's sign-in provider and the PHASELINE_QUOTA_* defaults: an anonymous account gets its own limit", async () => {
    process.env.GCLOUD_PROJECT = firestore.projectId;
    // The admin SDK then accepts unsigned tokens, and asks the Auth emulator whether the user
    // exists and is enabled: this stand-in says yes to every user.
    const auth = createServer((incoming, outgoing) => {
      const chunks: Buffer[] = [];
      incoming.on('data', (chunk: Buffer) => chunks.push(chunk));
      incoming.on('end', () => {
        const { localId = [] } = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}') as { localId?: string[] };
        outgoing.setHeader('content-type', 'application/json').end(JSON.stringify({ users: localId.map((uid) => ({ localId: uid, disabled: false })) }));
      });
    });
    await new Promise<void>((resolve) => auth.listen(0, '127.0.0.1', resolve));
    process.env.FIREBASE_AUTH_EMULATOR_HOST = `127.0.0.1:${(auth.address() as AddressInfo).port}`;
    process.env.METADATA_SERVER_DETECTION = 'none';
    process.env.PHASELINE_QUOTA_ANONYMOUS_JOBS_IN_FLIGHT = '2';
    provideBackends({ firestore: firestore.db, queue: new RecordingTaskQueue() });
    const post = async (token: string, text: string): Promise<FakeResponse> => {
      const headers: Record<string, string> = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };
      const body = JSON.stringify({ pipeline: 'canary', input: { text } });
      const response = new FakeResponse();
      const call = submitJobTrigger as unknown as (request: unknown, response: unknown) => Promise<void>;
      await call({ method: 'POST', headers, get: (name: string) => headers[name.toLowerCase()], header: (name: string) => headers[name.toLowerCase()], rawBody: Buffer.from(body) }, response);
      return response;
    };

    const anonymous = idToken('trigger-anon', 'anonymous');
    expect([(await post(anonymous, 'One.')).statusCode, (await post(anonymous, 'Two.')).statusCode]).toEqual([202, 202]);
    const refused = await post(anonymous, 'Three.');
    expect(refused.statusCode).toBe(429);
    expect(refused.body).toMatchObject({ limit: 'jobs_in_flight', allowed: 2 });
    // A signed-in account has the signed-in default, 3.
    const signedIn = idToken('trigger-user', 'password');
    const answers = [await post(signedIn, 'One.'), await post(signedIn, 'Two.'), await post(signedIn, 'Three.'), await post(signedIn, 'Four.')];
    expect(statuses(answers)).toEqual([202, 202, 202, 429]);
    await new Promise<void>((resolve) => auth.close(() => resolve()));
  });
});
