import { SpendLimitReachedError } from '../../functions/src/core/errors';
import { BUDGET_CANCEL, BUDGET_QUESTION_ID } from '../../functions/src/core/lifecycle';
import { DEFAULT_SETTLE_GRACE_MS } from '../../functions/src/effects/after-stop';
import { cancellationReport } from '../../functions/src/effects/stop-report';
import type { PipelineRegistry } from '../../functions/src/core/pipeline';
import { createJobActionHandler } from '../../functions/src/http/job-actions-handler';
import { cancelJob, decideJob, OwnerActionError } from '../../functions/src/engine/owner-actions';
import { OperatorActionRefusedError, redriveJob } from '../../functions/src/engine/operator';
import { runStep } from '../../functions/src/engine/step';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS, jobPath } from '../../functions/src/store/paths';
import { dyingInsideItsChange } from '../support/dead-client';
import { engineSuite, gate } from '../support/engine';
import { behaviour, testPipelines } from '../support/test-pipeline';
import { RecordingResponse } from '../support/http';

const harness = engineSuite('owner-actions', testPipelines);

const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());

/** The first phase asks the owner which way to go, and obeys the answer. */
function askFirst(): void {
  behaviour.first = (context) => {
    const answer = context.decisions.scope;
    if (answer === undefined) {
      return Promise.resolve({ kind: 'wait', reason: 'decision', questionId: 'scope', question: 'How many sections?', options: ['one', 'three'] });
    }
    return Promise.resolve({ kind: 'done', state: { sections: answer === 'one' ? 1 : 3 } });
  };
}

describe('decisions', () => {
  test('a waiting job carries its question; only a valid answer from its owner requeues it, and the phase reads the answer', async () => {
    askFirst();
    const jobId = await harness.submit('two-phase', { sections: 2 }, 'owner-1');
    expect((await harness.drain()).map((outcome) => outcome.kind)).toEqual(['waiting']);
    expect((await readJob(jobId)).waiting).toEqual({ reason: 'decision', questionId: 'scope', question: 'How many sections?', options: ['one', 'three'], untilMs: null });

    const attempt = (request: Partial<{ owner: string; questionId: string; answer: string }>) =>
      decideJob(harness.store, harness.queue, { jobId, owner: 'owner-1', questionId: 'scope', answer: 'three', ...request });
    await expect(attempt({ owner: 'someone-else' })).rejects.toMatchObject({ status: 404 });
    await expect(attempt({ questionId: 'budget' })).rejects.toMatchObject({ status: 409 });
    await expect(attempt({ answer: 'seven' })).rejects.toThrow(/not one of the options/);
    expect(harness.queue.tasks).toHaveLength(0);

    await attempt({});
    expect(await readJob(jobId)).toMatchObject({ status: 'queued', waiting: null, decisions: { scope: 'three' } });
    await expect(attempt({})).rejects.toMatchObject({ status: 409 }); // answered already
    await harness.drain();
    expect((await db().doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown')).toBe('total 30');
  });

  test('a wait for a person never times out into a default answer', async () => {
    askFirst();
    const jobId = await harness.submit('two-phase', { sections: 2 });
    await harness.drain();
    harness.clock.advance(30 * 24 * 3_600_000);
    await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
    expect(harness.queue.tasks).toHaveLength(0);
    expect((await readJob(jobId)).status).toBe('waiting');
  });
});

describe('cancellation', () => {
  test("a cancel whose client dies inside it (ledger read, in-flight entry decided unknown, commit never sent) holds nothing: the owner's answer lands at once, and the ledger is as it was", async () => {
    askFirst();
    const jobId = await harness.submit('two-phase', { sections: 2 }, 'owner-1');
    expect((await harness.drain()).map((outcome) => outcome.kind)).toEqual(['waiting']);
    await db().doc(`${JOBS}/${jobId}/effects/fx-flight`).set({ state: 'applying' });
    const dying = dyingInsideItsChange(harness.store);
    void cancelJob(dying.store, { jobId, owner: 'owner-1', reason: 'changed my mind' });
    await dying.decided;

    expect(await decideJob(harness.store, harness.queue, { jobId, owner: 'owner-1', questionId: 'scope', answer: 'one' })).toMatchObject({ status: 'queued' });

    expect(await readJob(jobId)).toMatchObject({ status: 'queued', cancellation: null, decisions: { scope: 'one' } });
    expect((await db().doc(`${JOBS}/${jobId}/effects/fx-flight`).get()).get('state')).toBe('applying');
    expect(harness.queue.tasks).toHaveLength(1);
  });

  test('stops a running job at once: its worker is refused and aborted, in-flight effects become unknown, and the report says what was done', async () => {
    const hold = gate();
    let abortedAfterCancel = false;
    behaviour.first = async (context) => {
      await hold.promise;
      await context.recordSection('late', { value: 1 }).catch(() => undefined);
      abortedAfterCancel = context.signal.aborted;
      return { kind: 'done', state: { sections: 1 } };
    };
    const jobId = await harness.submit('two-phase', { sections: 1 }, 'owner-1');
    await db().doc(`${JOBS}/${jobId}/effects/fx-sent`).set({ state: 'applied' });
    await db().doc(`${JOBS}/${jobId}/effects/fx-flight`).set({ state: 'applying' });
    await db().doc(`${JOBS}/${jobId}/effects/fx-later`).set({ state: 'planned' });
    const [task] = harness.queue.drain();
    const worker = runStep(harness.deps(), task!.task);
    for (let tries = 0; tries < 200 && (await readJob(jobId)).status !== 'running'; tries += 1) await new Promise((resolve) => setImmediate(resolve));

    await expect(cancelJob(harness.store, { jobId, owner: 'someone-else', reason: 'x' })).rejects.toBeInstanceOf(OwnerActionError);
    const { job, unknownEffects } = await cancelJob(harness.store, { jobId, owner: 'owner-1', reason: 'changed my mind' });
    expect(unknownEffects).toBe(1);
    expect(job.status).toBe('cancelled');
    expect(job.cancellation).toEqual({
      atMs: harness.clock.now(),
      reason: 'changed my mind',
      by: null,
      phase: null,
      sectionsDone: null,
      effects: { counts: { planned: 1, applying: 0, applied: 1, unknown: 1, failed: 0 }, settled: false, checkedWith: null, checkedAtMs: null },
    });
    // The sweeper checks the unknown one with the system of record once the grace period is over.
    expect(job.effectsToSettleAtMs).toBe(harness.clock.now() + DEFAULT_SETTLE_GRACE_MS);
    expect(cancellationReport(job.cancellation!)).toMatch(/Effects: 1 applied, 1 not applied, 1 unknown \(being checked\)\. .*cannot be undone/);
    expect((await db().doc(`${JOBS}/${jobId}/effects/fx-flight`).get()).get('state')).toBe('unknown');

    hold.open();
    expect((await worker).kind).toBe('ownership-lost');
    expect(abortedAfterCancel).toBe(true);
    expect((await readJob(jobId)).status).toBe('cancelled');
    expect(harness.queue.tasks).toHaveLength(0);
    await expect(cancelJob(harness.store, { jobId, owner: 'owner-1', reason: 'again' })).rejects.toMatchObject({ status: 409 });
  });
});

describe('over HTTP', () => {
  const call = async (action: 'cancel' | 'decide', body: unknown, token = 'token-of-owner-1', pipelines: PipelineRegistry = testPipelines) => {
    const handler = createJobActionHandler(action, {
      store: harness.store,
      queue: harness.queue,
      verifyToken: (value) => (value === 'token-of-owner-1' ? Promise.resolve({ uid: 'owner-1' }) : Promise.reject(new Error('bad token'))),
      pipelines,
      logger: { warn: () => undefined, error: () => undefined },
    });
    const response = new RecordingResponse();
    const headers: Record<string, string> = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };
    await handler({ method: 'POST', get: (name) => headers[name.toLowerCase()], rawBody: Buffer.from(JSON.stringify(body)) }, response);
    return { status: response.statusCode ?? 0, body: response.body, headers: response.headersAsSet };
  };

  test.each([
    ['cancel', { jobId: '../x' }, 400, /jobId/],
    ['cancel', { jobId: 'nope' }, 404, /No job nope/],
    ['decide', { jobId: 'nope', questionId: 'q' }, 400, /answer/],
    ['decide', { jobId: 'nope', questionId: 'q', answer: 'a' }, 404, /No job/],
  ] as const)('%s %j answers %i', async (action, body, status, message) => {
    const sent = await call(action, body);
    expect(sent.status).toBe(status);
    expect(JSON.stringify(sent.body)).toMatch(message);
  });

  test('bug 32: a lone surrogate in a cancel reason or an answer is a 400, not a 500; the job is unchanged', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 }, 'owner-1');
    const before = (await db().doc(jobPath(jobId)).get()).data();
    const cancel = await call('cancel', { jobId, reason: 'no longer \ud800 needed' });
    expect(cancel).toMatchObject({ status: 400, body: { error: 'invalid_text', message: expect.stringMatching(/lone surrogate[\s\S]*at reason/) as unknown } });
    const decide = await call('decide', { jobId, questionId: 'scope', answer: '\udfff' });
    expect(decide).toMatchObject({ status: 400, body: { error: 'invalid_text', message: expect.stringMatching(/at answer/) as unknown } });
    expect((await db().doc(jobPath(jobId)).get()).data()).toEqual(before);
  });

  test("bug 29: an owner without the pipeline's grant cannot answer its job's question (an answer makes it go on): 403, the job still waits; cancelling stays theirs", async () => {
    askFirst();
    const jobId = await harness.submit('two-phase', { sections: 1 }, 'owner-1');
    expect((await harness.drain()).map((outcome) => outcome.kind)).toEqual(['waiting']);
    // The same pipelines, now each granted by an operator only (owner-1 holds no grant).
    const grantedOnly: PipelineRegistry = new Map([...testPipelines].map(([name, pipeline]) => [name, { ...pipeline, access: 'granted' as const }]));
    const refused = await call('decide', { jobId, questionId: 'scope', answer: 'one' }, undefined, grantedOnly);
    expect(refused).toMatchObject({ status: 403, body: { error: 'forbidden', message: expect.stringMatching(/needs an operator's grant/) as unknown } });
    expect(await readJob(jobId)).toMatchObject({ status: 'waiting', decisions: {} });
    expect(harness.queue.tasks).toEqual([]);
    expect((await call('decide', { jobId, questionId: 'scope', answer: 'one' })).status).toBe(200);
    expect((await call('cancel', { jobId }, undefined, grantedOnly)).status).toBe(200);
  });

  test('a bad token is a 401 and changes nothing', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 }, 'owner-1');
    const sent = await call('cancel', { jobId }, 'forged');
    expect(sent.status).toBe(401);
    expect((await readJob(jobId)).status).toBe('queued');
  });

  test('the owner cancels over HTTP and gets the report back', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 }, 'owner-1');
    const sent = await call('cancel', { jobId, reason: 'testing' });
    expect(sent.status).toBe(200);
    expect(sent.body).toMatchObject({ jobId, status: 'cancelled', unknownEffects: 0 });
    expect((sent.body as { report: string }).report).toMatch(/Cancelled by its owner .*\(testing\)/);
  });
});

// Who a cancel is attributed to, through the engine's own paths (the owner's cancel, the
// spend-limit cancel through the budget question, an operator's cancel on the owner's behalf), in
// the stored record, its timeline event and the re-drive refusal.
const cancelEvents = async (jobId: string) =>
  (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.filter((doc) => doc.get('kind') === 'cancelled').map((doc) => doc.get('message') as string);

/** A job that ran its first phase into the owner's daily cap: waiting with the budget question. */
async function waitingAtCap(): Promise<string> {
  behaviour.first = () => Promise.reject(new SpendLimitReachedError('Daily spend limit reached.', 5, 5, harness.clock.now() + 3_600_000));
  const jobId = await harness.submit('two-phase', { sections: 1 });
  expect((await harness.drain(1))[0]).toMatchObject({ kind: 'waiting', reason: 'budget' });
  expect((await readJob(jobId)).waiting).toMatchObject({ reason: 'budget', questionId: BUDGET_QUESTION_ID });
  return jobId;
}

test("the owner's cancel at the spend limit (the budget question's cancel) is the owner's: no operator, and its words say so", async () => {
  const jobId = await waitingAtCap();
  const cancelled = await decideJob(harness.store, harness.queue, { jobId, owner: 'user-1', questionId: BUDGET_QUESTION_ID, answer: BUDGET_CANCEL });
  expect(cancelled.status).toBe('cancelled');
  const job = await readJob(jobId);
  expect(job.cancellation).toMatchObject({ by: null, reason: 'stopped by its owner at the daily spend limit', phase: null });
  expect(await cancelEvents(jobId)).toEqual(['Cancelled by its owner during its first step (stopped by its owner at the daily spend limit).']);
  await expect(redriveJob(harness.store, harness.queue, { jobId, fromPhase: 'first', by: 'op-bob', reason: 'try again' }, harness.clock.now(), { pipelines: testPipelines })).rejects.toThrow(
    /was cancelled by its owner/,
  );
});

test("an operator's cancel of a job waiting at its owner's cap names the operator everywhere, never the owner", async () => {
  const jobId = await waitingAtCap();
  const { job } = await cancelJob(harness.store, { jobId, owner: 'user-1', reason: 'runaway spend', by: 'op-alice' });
  expect(job.cancellation).toMatchObject({ by: 'op-alice', reason: 'runaway spend' });
  expect((await readJob(jobId)).cancellation).toMatchObject({ by: 'op-alice', reason: 'runaway spend' });
  const [event] = await cancelEvents(jobId);
  expect(event).toBe('Cancelled by operator op-alice during its first step (runaway spend).');
  expect(event).not.toMatch(/its owner/);
  const refusal = redriveJob(harness.store, harness.queue, { jobId, fromPhase: 'first', by: 'op-bob', reason: 'try again' }, harness.clock.now(), { pipelines: testPipelines });
  await expect(refusal).rejects.toBeInstanceOf(OperatorActionRefusedError);
  await expect(refusal).rejects.toThrow(/was cancelled by operator op-alice/);
});

test("the owner's own cancel of a queued job stores no operator", async () => {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  await cancelJob(harness.store, { jobId, owner: 'user-1', reason: 'changed my mind' });
  const job = await readJob(jobId);
  expect(job.cancellation).toMatchObject({ by: null, reason: 'changed my mind', phase: null });
  expect(await cancelEvents(jobId)).toEqual(['Cancelled by its owner during its first step (changed my mind).']);
  // The stored map carries `by: null`, not a missing key (readers of the raw document see it either way).
  expect((await db().doc(jobPath(jobId)).get()).get('cancellation.by')).toBeNull();
});
