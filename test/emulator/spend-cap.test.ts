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
import { nextSpendResetMs, spendDay } from '../../functions/src/core/quota';
import { cancelJob, decideJob, OwnerActionError } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { createOpenAiCompatibleProvider } from '../../functions/src/providers/openai-compatible';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob, decodeUnit } from '../../functions/src/store/codec';
import { JOBS, quotaUsagePath, SPEND_CHARGES, spendDayPath, userLimitsPath } from '../../functions/src/store/paths';
import { EXPIRE_AT } from '../../functions/src/store/retention';
import { setUserLimits } from '../../functions/src/store/quota-documents';
import type { Timestamp } from 'firebase-admin/firestore';
import type { ChatResponse } from '../../functions/src/agent/provider';
import { engineSuite, gate } from '../support/engine';
import { ManualTimers } from '../support/timers';
import { answerLostAfterFirstCommit } from '../support/interpose';
import { promptIdOf, researchSetup, type ResearchSetup } from '../support/research';

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
