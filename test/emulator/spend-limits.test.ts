/**
 * The daily spend cap per user on the official Firestore emulator: research jobs whose model calls
 * cost money (the offline simulator at $0.50 / $1.50 per 1,000 tokens) charge their owner's day in
 * `quotaUsage/{uid}/spendDays/{day}`, every call counted (wasted ones too); a job whose owner
 * reaches the cap stops at the next call's boundary and waits (reason `budget`) with a question,
 * spending past the cap by at most the call that was in flight; it resumes when the day ends, when
 * its owner answers after an operator raised the cap, or is cancelled by its owner.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { BUDGET_CANCEL, BUDGET_QUESTION_ID, BUDGET_RESUME } from '../../functions/src/core/lifecycle';
import { nextSpendResetMs, spendDay, DEFAULT_QUOTA_DEFAULTS } from '../../functions/src/core/quota';
import { cancelJob, decideJob, OwnerActionError } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { createOpenAiCompatibleProvider } from '../../functions/src/providers/openai-compatible';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob, decodeUnit } from '../../functions/src/store/codec';
import { JOBS, quotaUsagePath, SPEND_CHARGES, spendDayPath, userLimitsPath } from '../../functions/src/store/paths';
import { EXPIRE_AT } from '../../functions/src/store/retention';
import { setUserLimits, SpendLedger, readUserLimits } from '../../functions/src/store/quota-documents';
import type { Timestamp } from 'firebase-admin/firestore';
import type { ChatResponse } from '../../functions/src/agent/provider';
import { engineSuite, gate } from '../support/engine';
import { ManualTimers } from '../support/timers';
import { answerLostAfterFirstCommit } from '../support/interpose';
import { promptIdOf, researchSetup, type ResearchSetup } from '../support/research';
import { ManualClock } from '../../functions/src/core/clock';
import { SpendLimitReachedError } from '../../functions/src/core/errors';
import { StepSpendMeter } from '../../functions/src/engine/spend-meter';
import { openTestFirestore, type TestFirestore } from '../support/firestore';

let research: ResearchSetup;

const harness = engineSuite('spend-cap', (firestore, clock) => {
  research = researchSetup(firestore.db, clock);
  return research.registry;
}, {
  beforeEach: () => {
    research.provider.intercept = null;
  },
});

const db = () => harness.firestore.db;
const question = { question: 'How do fencing tokens stop stale writers?', experts: 2, sections: 2, wordsPerSection: 60 };
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const spentToday = async (owner: string): Promise<number> => ((await db().doc(spendDayPath(owner, spendDay(harness.clock.now()))).get()).get('usd') as number | undefined) ?? 0;

/** Every model call's reported cost, in order, and the section it was for. */
function recordCalls(): { costs: number[]; prompts: string[]; threadLengths: number[] } {
  const seen = { costs: [] as number[], prompts: [] as string[], threadLengths: [] as number[] };
  research.provider.intercept = async (request, call) => {
    const response = await call();
    seen.costs.push(response.costUsd);
    seen.prompts.push(promptIdOf(request));
    seen.threadLengths.push(request.messages.length);
    return response;
  };
  return seen;
}
const sum = (values: readonly number[]): number => values.reduce((total, value) => total + value, 0);

test('a job whose owner reaches the cap waits with a question after at most the call in flight, and resumes once the owner answers after a raise', async () => {
  const owner = 'user-capped';
  await setUserLimits(db(), owner, { spendUsdPerDay: 0.05 }, harness.clock.now());
  // Just under the cap: one more call may start, and none after it.
  await db().doc(spendDayPath(owner, spendDay(harness.clock.now()))).set({ usd: 0.049_999 });
  const calls = recordCalls();

  const jobId = await harness.submit('research', question, owner);
  const outcomes = await harness.drain();
  expect(outcomes.at(-1)).toEqual({ kind: 'waiting', reason: 'budget' });
  expect(calls.costs).toHaveLength(1);
  expect(calls.costs[0]).toBeGreaterThan(0);
  // Past the cap by exactly the call that was in flight when it was reached.
  expect(await spentToday(owner)).toBeCloseTo(0.049_999 + (calls.costs[0] ?? 0), 9);

  const waiting = await readJob(jobId);
  expect(waiting.status).toBe('waiting');
  expect(waiting.waiting).toMatchObject({ reason: 'budget', questionId: BUDGET_QUESTION_ID, options: [BUDGET_RESUME, BUDGET_CANCEL], untilMs: nextSpendResetMs(harness.clock.now()) });
  expect(waiting.waiting?.question).toMatch(/reached this account's daily limit of \$0\.05; it resets at \d{4}-\d\d-\d\d 00:00 UTC\. The job waits/);
  // A wait at the cap spends no attempt: it is not the job's failure.
  expect(waiting.attempts).toBe(0);
  // The answer that came back is durable (resuming goes on from it; checked below: the outline is not asked for again).
  const transcripts = await db().collection(`${JOBS}/${jobId}/transcripts`).get();
  expect(transcripts.size).toBeGreaterThan(0);

  // Resumed without a raise: the first call is refused again, and nothing is spent.
  await decideJob(harness.store, harness.queue, { jobId, owner, questionId: BUDGET_QUESTION_ID, answer: BUDGET_RESUME });
  expect((await harness.drain()).at(-1)).toEqual({ kind: 'waiting', reason: 'budget' });
  expect(calls.costs).toHaveLength(1);

  // An operator raises the cap; the owner resumes; the job completes, the outline's thread going on from the answer it had.
  await setUserLimits(db(), owner, { spendUsdPerDay: 10_000 }, harness.clock.now());
  await decideJob(harness.store, harness.queue, { jobId, owner, questionId: BUDGET_QUESTION_ID, answer: BUDGET_RESUME });
  await harness.drain();
  const done = await readJob(jobId);
  expect(done.status).toBe('completed');
  expect(calls.prompts[1]).toBe('outline');
  expect(calls.threadLengths[1]).toBeGreaterThan(calls.threadLengths[0] ?? Infinity);
  // Every call charged the owner's day, and the job's own cost agrees.
  expect(await spentToday(owner)).toBeCloseTo(0.049_999 + sum(calls.costs), 9);
  expect(done.cost.spentUsd).toBeCloseTo(sum(calls.costs), 9);
});

test('wasted calls count: an answer thrown away is charged like any other', async () => {
  const owner = 'user-wasteful';
  await setUserLimits(db(), owner, { spendUsdPerDay: 10_000 }, harness.clock.now());
  let emptied = 0;
  const costs: number[] = [];
  research.provider.intercept = async (_request, call) => {
    const response = await call();
    costs.push(response.costUsd);
    // The first two answers come back empty: billed, and thrown away by the section's retries.
    if (emptied < 2) {
      emptied += 1;
      return { ...response, message: { role: 'assistant', content: '' } } satisfies ChatResponse;
    }
    return response;
  };
  const jobId = await harness.submit('research', question, owner);
  await harness.drain();
  const job = await readJob(jobId);
  expect(job.status).toBe('completed');
  expect(job.cost.wastedModelCalls).toBeGreaterThanOrEqual(2);
  expect(job.cost.wastedUsd).toBeGreaterThan(0);
  expect(await spentToday(owner)).toBeCloseTo(sum(costs), 9);
  expect((await db().doc(spendDayPath(owner, spendDay(harness.clock.now()))).get()).get('calls')).toBe(costs.length);
});

test('a unit of a fan-out that meets the cap makes the whole job wait; the sweeper resumes it when the day ends', async () => {
  const owner = 'user-fanout';
  await setUserLimits(db(), owner, { spendUsdPerDay: 1_000 }, harness.clock.now());
  const dayRef = db().doc(spendDayPath(owner, spendDay(harness.clock.now())));
  let expertCalls = 0;
  research.provider.intercept = async (request, call) => {
    // An expert section's first call: someone else's spend takes the owner to the cap meanwhile.
    if (/^e\d+-h\d+$/.test(promptIdOf(request)) && expertCalls++ === 0) await dayRef.set({ usd: 1_000 });
    return call();
  };
  const jobId = await harness.submit('research', question, owner);
  const outcomes = await harness.drain();
  expect(outcomes).toContainEqual({ kind: 'waiting', reason: 'budget' });
  const waiting = await readJob(jobId);
  expect(waiting.status).toBe('waiting');
  expect(waiting.waiting?.reason).toBe('budget');
  expect(waiting.fanout).toBeNull();
  const units = await db().collection(`${JOBS}/${jobId}/units`).get();
  expect(units.docs.map((doc) => decodeUnit(doc.ref.path, doc.data()).lease)).toEqual(units.docs.map(() => null));
  // Each unit's step stopped at its first refused call: one call was in flight when the cap was reached.
  expect(expertCalls).toBe(1);

  // A raise alone does not restart it; the day's end does, through the sweeper.
  await setUserLimits(db(), owner, { spendUsdPerDay: 100_000 }, harness.clock.now());
  const untilMs = waiting.waiting?.untilMs ?? 0;
  harness.clock.set(untilMs + 1);
  await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  const resumed = await readJob(jobId);
  expect(resumed.status).toBe('queued');
  const events = await db().collection(`${JOBS}/${jobId}/events`).where('kind', '==', 'resumed').get();
  expect(events.docs.map((doc) => doc.get('message') as string).join()).toMatch(/The daily spend limit reset/);
  await harness.drain();
  expect((await readJob(jobId)).status).toBe('completed');
});

test('the owner may stop a job at its cap; answers that do not fit are refused and change nothing', async () => {
  const owner = 'user-stopping';
  await setUserLimits(db(), owner, { spendUsdPerDay: 0 }, harness.clock.now());
  const jobId = await harness.submit('research', question, owner);
  await harness.drain();
  expect((await readJob(jobId)).waiting?.reason).toBe('budget');

  await expect(decideJob(harness.store, harness.queue, { jobId, owner, questionId: BUDGET_QUESTION_ID, answer: 'later' })).rejects.toBeInstanceOf(OwnerActionError);
  await expect(decideJob(harness.store, harness.queue, { jobId, owner: 'someone-else', questionId: BUDGET_QUESTION_ID, answer: BUDGET_CANCEL })).rejects.toMatchObject({ status: 404 });
  expect((await readJob(jobId)).status).toBe('waiting');

  const cancelled = await decideJob(harness.store, harness.queue, { jobId, owner, questionId: BUDGET_QUESTION_ID, answer: BUDGET_CANCEL });
  expect(cancelled.status).toBe('cancelled');
  expect((await readJob(jobId)).cancellation?.reason).toBe('stopped by its owner at the daily spend limit');
  // A cap of 0: not one call was made.
  expect(await spentToday(owner)).toBe(0);
  expect((await db().doc(userLimitsPath(owner)).get()).get('spendUsdPerDay')).toBe(0);
});

test('a job that is not waiting at its cap cannot be cancelled through the budget question', async () => {
  const owner = 'user-at-cap';
  await setUserLimits(db(), owner, { spendUsdPerDay: 0 }, harness.clock.now());
  const jobId = await harness.submit('research', question, owner);
  // The job is queued, not waiting at its cap: "cancel" on the budget question is refused.
  await expect(decideJob(harness.store, harness.queue, { jobId, owner, questionId: BUDGET_QUESTION_ID, answer: BUDGET_CANCEL })).rejects.toMatchObject({ status: 409 });
  expect((await readJob(jobId)).status).toBe('queued');
});

test("an operator's cut applies from the next model call: the job waits at once, not at its next step", async () => {
  const owner = 'user-cut-off';
  await setUserLimits(db(), owner, { spendUsdPerDay: 10_000 }, harness.clock.now());
  const prompts: string[] = [];
  let cutAfter = -1;
  research.provider.intercept = async (request, call) => {
    prompts.push(promptIdOf(request));
    const response = await call();
    // The first expert call comes back; the operator cuts the user to $0 meanwhile.
    if (cutAfter < 0 && promptIdOf(request) === 'e1-h1') {
      await setUserLimits(db(), owner, { spendUsdPerDay: 0 }, harness.clock.now());
      cutAfter = prompts.length;
    }
    return response;
  };
  const jobId = await harness.submit('research', question, owner);
  await harness.drain();
  expect(cutAfter).toBeGreaterThan(0);
  // Other units' calls already in flight may finish; no call starts after the cut in the step that saw it, and none after that.
  expect(prompts.slice(cutAfter).filter((prompt) => prompt.startsWith('e1-'))).toEqual([]);
  expect((await readJob(jobId)).waiting?.reason).toBe('budget');
});

test('an unreadable spend record makes the job wait, naming the document; repaired, the job goes on', async () => {
  const owner = 'user-malformed-day';
  const dayRef = db().doc(spendDayPath(owner, spendDay(harness.clock.now())));
  await dayRef.set({ usd: 'lots' });
  const jobId = await harness.submit('research', question, owner);
  await harness.drain();
  const waiting = await readJob(jobId);
  expect(waiting.status).toBe('waiting');
  expect(waiting.waiting?.reason).toBe('budget');
  expect(waiting.waiting?.question).toMatch(/spend record cannot be read \(quotaUsage\/user-malformed-day\/spendDays\/\d{4}-\d\d-\d\d is malformed/);
  await setUserLimits(db(), owner, { spendUsdPerDay: 10_000 }, harness.clock.now());
  // An operator's credit that overshoots below zero is still a readable day.
  await dayRef.set({ usd: -0.5 });
  await decideJob(harness.store, harness.queue, { jobId, owner, questionId: BUDGET_QUESTION_ID, answer: BUDGET_RESUME });
  await harness.drain();
  expect((await readJob(jobId)).status).toBe('completed');
});

test('a malformed quotaUsage/{uid} (the kind of account, so the default cap) makes the job wait, not fail', async () => {
  const owner = 'user-malformed-usage';
  await db().doc(quotaUsagePath(owner)).set({ inFlightJobIds: 'not a list', recentSubmitsAtMs: [], updatedAtMs: 0 });
  const jobId = await harness.submit('research', question, owner);
  await harness.drain();
  const job = await readJob(jobId);
  expect(job.status).toBe('waiting');
  expect(job.waiting?.reason).toBe('budget');
  expect(await spentToday(owner)).toBe(0);
});

test('bug 22: a charge whose commit landed but whose answer was lost is counted once, and the cap does not pause the job', async () => {
  const owner = 'user-lost-answer';
  await setUserLimits(db(), owner, { spendUsdPerDay: 1.2 }, harness.clock.now());
  const dayPath = spendDayPath(owner, spendDay(harness.clock.now()));
  // The first two calls cost $0.50 each, the others nothing: $1.00 spent in all, under the $1.20 cap.
  let calls = 0;
  research.provider.intercept = async (_request, call) => {
    const response = await call();
    calls += 1;
    return { ...response, costUsd: calls <= 2 ? 0.5 : 0 };
  };
  const lost = answerLostAfterFirstCommit((paths) => paths.includes(dayPath));
  let jobId: string;
  try {
    jobId = await harness.submit('research', question, owner);
    await harness.drain();
  } finally {
    lost.restore();
  }
  expect(lost.ran()).toBe(true);
  expect(await spentToday(owner)).toBeCloseTo(1, 9);
  expect((await db().doc(dayPath).get()).get('calls')).toBe(2);
  // One record per write beside the day, expiring with it.
  const records = await db().collection(`${dayPath}/${SPEND_CHARGES}`).get();
  expect(records.docs.map((record) => record.get('usd') as number)).toEqual([0.5, 0.5]);
  const dayExpiry = ((await db().doc(dayPath).get()).get(EXPIRE_AT) as Timestamp).toMillis();
  expect(records.docs.map((record) => (record.get(EXPIRE_AT) as Timestamp).toMillis())).toEqual([dayExpiry, dayExpiry]);
  const job = await readJob(jobId);
  expect(job.waiting).toBeNull();
  expect(job.status).toBe('completed');
  expect(calls).toBeGreaterThan(2);
});

test('bug 37: a model call streaming when its owner cancels the job is charged what was streamed, before the step ends', async () => {
  const owner = 'user-cancelling';
  const streamed = 'An outline the owner stops while it is being written. '.repeat(10);
  const bodies: string[] = [];
  // A Chat Completions endpoint that streams the start of an answer and then holds the stream open.
  const server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      bodies.push(Buffer.concat(chunks).toString('utf8'));
      response.writeHead(200, { 'content-type': 'text/event-stream' });
      response.write(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { role: 'assistant', content: streamed }, finish_reason: null }] })}\n\n`);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const endpoint = createOpenAiCompatibleProvider(
      { baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, model: 'm', timeoutMs: 60_000, contextWindowTokens: 128_000, inputUsdPer1kTokens: 0.5, outputUsdPer1kTokens: 2 },
      { clock: harness.clock },
    );
    const streaming = gate();
    research.provider.intercept = (request) =>
      endpoint.chat({
        ...request,
        onText: (text) => {
          request.onText?.(text);
          streaming.open();
        },
      });
    const jobId = await harness.submit('research', question, owner);
    const task = harness.queue.tasks.shift();
    if (!task) throw new Error('no task');
    const timers = new ManualTimers();
    // An object: the loop below sees the step's outcome when it arrives.
    const ended: { outcome: StepOutcome | null } = { outcome: null };
    const step = runStep(harness.deps('worker-a', { timers }), task.task).then((outcome) => (ended.outcome = outcome));
    await streaming.promise;
    await cancelJob(harness.store, { jobId, owner, reason: 'changed my mind' });
    // The step's next write (its heartbeat) finds the job cancelled and aborts the call in flight.
    const until = Date.now() + 20_000;
    while (ended.outcome === null && Date.now() < until) {
      timers.fireAll();
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    await step;
    expect(ended.outcome).toMatchObject({ kind: 'ownership-lost' });
    // Input estimated from the request, output from the text streamed, four characters a token; charged by the time the step ended.
    const expected = (Math.ceil((bodies[0]?.length ?? 0) / 4) / 1000) * 0.5 + (Math.ceil(streamed.length / 4) / 1000) * 2;
    expect(expected).toBeGreaterThan(0);
    expect(await spentToday(owner)).toBeCloseTo(expected, 12);
    expect((await readJob(jobId)).status).toBe('cancelled');
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});

/** The spend check across UTC midnight: which override a step already running applies after it (the day's copy, or userLimits as its first check read it). */
describe('the day boundary (midnight UTC)', () => {
  let firestore: TestFirestore;
  beforeAll(() => {
    firestore = openTestFirestore('spend-midnight');
  });
  beforeEach(() => firestore.reset());
  afterAll(() => firestore.close());

  const db = () => firestore.db;
  const ledger = () => new SpendLedger(db(), DEFAULT_QUOTA_DEFAULTS);
  const verdict = (meter: StepSpendMeter) =>
    meter.beforeCall().then(
      () => 'allowed',
      (error: unknown) => (error instanceof SpendLimitReachedError ? 'refused' : `error: ${String(error)}`),
    );

  test('a cut set the day before (copy only on today) still applies after midnight in a step in flight', async () => {
    const clock = new ManualClock(Date.UTC(2026, 11, 1, 23, 59));
    const uid = 'cut-yesterday';
    await setUserLimits(db(), uid, { spendUsdPerDay: 2 }, clock.now() - 86_400_000); // copies on Nov 30 and Dec 1
    const meter = new StepSpendMeter(ledger(), uid, clock);
    expect(await verdict(meter)).toBe('allowed');
    clock.advance(2 * 60_000); // Dec 2, no copy there
    await ledger().charge(uid, { id: 'another-worker', usd: 3, calls: 1 }, clock.now());
    expect(await verdict(meter)).toBe('refused');
  });

  test('a raise made during the step before midnight applies after midnight; a direct edit made before the step applies across midnight', async () => {
    const clock = new ManualClock(Date.UTC(2026, 11, 1, 23, 59));
    const uid = 'raise-in-flight';
    await setUserLimits(db(), uid, { spendUsdPerDay: 1_000 }, clock.now()); // copies Dec 1, Dec 2
    await db().doc(userLimitsPath(uid)).set({ spendUsdPerDay: 1, updatedAtMs: clock.now() }); // direct cut, no copy
    const meter = new StepSpendMeter(ledger(), uid, clock);
    expect(await verdict(meter)).toBe('allowed'); // $0 spent of $1
    clock.advance(2 * 60_000);
    await ledger().charge(uid, { id: 'another-worker', usd: 5, calls: 1 }, clock.now());
    // Dec 2's copy ($1000) equals Dec 1's as the first check saw it: the direct cut ($1) stands.
    expect(await verdict(meter)).toBe('refused');

    const clock2 = new ManualClock(Date.UTC(2026, 11, 5, 23, 59));
    const uid2 = 'raise-before-midnight';
    await setUserLimits(db(), uid2, { spendUsdPerDay: 1 }, clock2.now());
    const meter2 = new StepSpendMeter(ledger(), uid2, clock2);
    expect(await verdict(meter2)).toBe('allowed');
    await setUserLimits(db(), uid2, { spendUsdPerDay: 1_000 }, clock2.now());
    clock2.advance(2 * 60_000);
    await ledger().charge(uid2, { id: 'another-worker', usd: 5, calls: 1 }, clock2.now());
    expect(await verdict(meter2)).toBe('allowed');
  });

  test('a charge whose answer was lost just before midnight is sent again after it to the day it was made, once, and not counted against the new day', async () => {
    const clock = new ManualClock(Date.UTC(2026, 11, 1, 23, 59, 59));
    const uid = 'lost-at-midnight';
    await setUserLimits(db(), uid, { spendUsdPerDay: 0.5 }, clock.now());
    const before = spendDay(clock.now());
    const meter = new StepSpendMeter(ledger(), uid, clock, { chargeScope: 'job-1~job~epoch1', sleep: () => Promise.resolve() });
    expect(await verdict(meter)).toBe('allowed');
    const lost = answerLostAfterFirstCommit((paths) => paths.includes(spendDayPath(uid, before)));
    try {
      meter.charge(0.4);
      await new Promise((resolve) => setImmediate(resolve)); // its write is made up on Dec 1 and on its way; the answer will be lost
      clock.advance(2_000); // Dec 2
      meter.charge(0.3); // its write goes out after the lost one is sent again
      expect(await verdict(meter)).toBe('allowed'); // $0.30 of Dec 2's $0.50
      await meter.settle();
    } finally {
      lost.restore();
    }
    expect(lost.ran()).toBe(true);
    const usd = async (day: string) => ((await db().doc(spendDayPath(uid, day)).get()).get('usd') as number | undefined) ?? 0;
    expect(await usd(before)).toBeCloseTo(0.4, 9);
    expect(await usd(spendDay(clock.now()))).toBeCloseTo(0.3, 9);
    expect((await db().collection(`${spendDayPath(uid, before)}/${SPEND_CHARGES}`).get()).size).toBe(1);
  });
});

/**
 * The operator's override as the spend checks see it: `setUserLimits` copies it into today's and
 * tomorrow's spend days, which every check before a model call reads; a step's first check also
 * reads `userLimits` itself.
 */
describe('the limits as the owner reads them (copy)', () => {
  let firestore: TestFirestore;
  beforeAll(() => {
    firestore = openTestFirestore('spend-limits-copy');
  });
  beforeEach(() => firestore.reset());
  afterAll(() => firestore.close());

  const db = () => firestore.db;
  // Noon UTC: no midnight in these tests.
  const clock = new ManualClock(Date.UTC(2026, 11, 1, 12));
  // The defaults the deployment runs with: $10 a day for a signed-in account.
  const ledger = () => new SpendLedger(db(), DEFAULT_QUOTA_DEFAULTS);
  /** A new step's check before its first model call: resolves when the call may start. */
  const newStepMayCall = (uid: string): Promise<string> =>
    new StepSpendMeter(ledger(), uid, clock).beforeCall().then(
      () => 'call allowed',
      (error: unknown) => (error instanceof SpendLimitReachedError ? `refused: ${error.message}` : `error: ${String(error)}`),
    );

  test('clearing one limit with setUserLimits replaces the spend days\' copy as a whole: the checks apply the default the operator is shown', async () => {
    const uid = 'user-raised-then-cleared';
    // An operator raised the user's cap for a demo, then clears that raise (back to the default $10), keeping the jobs limit.
    await setUserLimits(db(), uid, { spendUsdPerDay: 1_000, jobsInFlight: 4 }, clock.now());
    await ledger().charge(uid, { id: 'earlier-calls', usd: 50, calls: 10 }, clock.now());
    // A step in flight: its first check passed under the raise.
    const running = new StepSpendMeter(ledger(), uid, clock);
    await running.beforeCall();
    await setUserLimits(db(), uid, { spendUsdPerDay: null }, clock.now());
    // Its next check reads the new copy of the override: the default applies from the next call.
    await expect(running.beforeCall()).rejects.toBeInstanceOf(SpendLimitReachedError);

    const view = await readUserLimits(db(), DEFAULT_QUOTA_DEFAULTS, uid);
    const { today } = await ledger().firstCheck(uid, clock.now());
    const check = await newStepMayCall(uid);

    // What the operator was told is in force: the default $10.
    expect(view.override).not.toHaveProperty('spendUsdPerDay');
    expect(view.signedIn.spendUsdPerDay).toBe(10);
    // The promise: the check before every call applies the same cap, so $50 spent refuses the next call.
    expect(today.capUsd).toBe(10);
    expect(check).toMatch(/^refused/);
  });

  test('a userLimits document edited by other means applies from the next step, even on days that hold an older copy', async () => {
    const uid = 'user-edited-directly';
    await setUserLimits(db(), uid, { spendUsdPerDay: 1_000 }, clock.now());
    await ledger().charge(uid, { id: 'earlier-calls', usd: 50, calls: 10 }, clock.now());
    // An operator cuts the user off by editing the override directly (the console, a script).
    await db().doc(userLimitsPath(uid)).set({ spendUsdPerDay: 0, updatedAtMs: clock.now() });

    const nextStep = await newStepMayCall(uid);
    clock.advance(86_400_000);
    const tomorrowStep = await newStepMayCall(uid);
    clock.advance(-86_400_000);
    expect(nextStep).toMatch(/^refused/);
    expect(tomorrowStep).toMatch(/^refused/);
  });

  test('a malformed spend day makes calls wait, and setUserLimits (any limit) does not turn it into $0 spent', async () => {
    const uid = 'user-malformed-day';
    const dayRef = db().doc(spendDayPath(uid, spendDay(clock.now())));
    await setUserLimits(db(), uid, { spendUsdPerDay: 5 }, clock.now());
    // Unreadable: nobody knows what the day spent (say $40, written as a string by a broken tool).
    await dayRef.set({ usd: '40.00', calls: 12 }, { merge: true });
    const before = await newStepMayCall(uid);

    // An operator changes an unrelated limit (the number of jobs in flight); the spend record is not repaired by anyone.
    await setUserLimits(db(), uid, { jobsInFlight: 2 }, clock.now());
    const after = await newStepMayCall(uid);
    // The spend is left as it was: still unreadable.
    expect((await dayRef.get()).get('usd')).toBe('40.00');

    expect(before).toMatch(/^refused: This account's spend record cannot be read/);
    // The promise: a malformed record makes the job wait until an operator repairs it; nothing is spent against it.
    expect(after).toMatch(/^refused/);
  });
});
