/**
 * The notify pipeline on the emulator against the local receiver: a long batch that yields, pauses
 * when the receiver goes down and resumes by itself when it recovers, and a cancel mid-batch whose
 * report, once reconciled, matches the receiver's records.
 */
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep } from '../../functions/src/engine/sweeper';
import { reconcileStoppedJob } from '../../functions/src/effects/after-stop';
import { cancellationReport } from '../../functions/src/effects/stop-report';
import { createHttpEffectAdapter } from '../../functions/src/effects/http-adapter';
import { effectEntrySchema } from '../../functions/src/effects/ledger';
import { buildPlan, notifyInput, notifyProgressFromLedger, UNAVAILABLE_QUESTION_ID } from '../../functions/src/pipelines/notify';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { gate } from '../support/engine';
import { eventually, httpAdapter, messagesPerRecipient, notifySuite } from '../support/receiver';

// A short step budget so that a long batch yields; every message moves the clock a second.
// The receiver moves the clock a second a message inside steps whose heartbeats are held back: a takeover age and lease past a 40 s step stand in for a live worker's renewals.
const { harness, notify, receiver } = notifySuite('notify', { options: { stepBudgetSeconds: 40, leaseSeconds: 90, staleHeartbeatSeconds: 60 } });

const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const ledger = async (jobId: string) => (await db().collection(`${JOBS}/${jobId}/effects`).get()).docs.map((doc) => effectEntrySchema.parse(doc.data()));
const sweepNow = () => sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
/** Patient enough that a held request is still in flight when a cancel lands, however slow the machine. */
const patientAdapter = () => createHttpEffectAdapter({ baseUrl: receiver().url, timeoutMs: 120_000, name: 'the test receiver' });
const yields = (outcomes: readonly StepOutcome[]) => outcomes.filter((outcome) => outcome.kind === 'handed-off' && !outcome.checkpointed).length;

test('120 messages, the receiver goes down at item 74: exact counts at the pause, a resume by itself after recovery, each message applied once', async () => {
  let wentDown = false;
  receiver().beforeApply = async ({ kind }) => {
    if (kind !== 'message') return;
    harness.clock.advance(1_000);
    if (!wentDown && receiver().applied('message').length === 73) {
      wentDown = true;
      await receiver().setAvailability('unavailable');
    }
  };
  const input = { campaign: 'Renewal', recipients: 120 };
  const jobId = await harness.submit('notify', input);
  const plan = buildPlan(jobId, notifyInput.parse(input));

  const first = await harness.drain();
  expect(first.at(-1)?.kind).toBe('waiting');
  expect(yields(first)).toBeGreaterThanOrEqual(2); // the batch went through several steps before the outage

  // At the pause: 73 sent and logged; item 74 was refused with a 503, so it is not done (and not unknown).
  let job = await readJob(jobId);
  expect(job.status).toBe('waiting');
  expect(job.progress).toEqual({ total: 120, done: 73, remaining: 47, needsAttention: 0, unknown: 0, sent: 73, logged: 73 });
  expect(job.waiting).toMatchObject({ reason: 'provider', questionId: UNAVAILABLE_QUESTION_ID, options: [] });
  expect(job.waiting?.question).toMatch(/^Service unavailable: the test receiver \(the test receiver answered 503\)\. 73 of 120 done, 47 remaining, 0 need attention, 0 unknown\./);
  const untilMs = job.waiting?.untilMs ?? 0;
  expect(untilMs).toBeGreaterThan(harness.clock.now());
  expect(receiver().applied('message')).toHaveLength(73);
  expect(receiver().applied('record')).toHaveLength(73);
  const item74 = plan.messages[73]!;
  expect((await ledger(jobId)).find((entry) => entry.key === item74.sendKey)).toMatchObject({ state: 'planned', attempts: 1 });

  // Before the wait is over the sweeper leaves it alone; at the end of it, the job resumes by itself
  // while the receiver is still down, and pauses again without sending anything.
  expect((await sweepNow()).resumed).toBe(0);
  harness.clock.set(untilMs);
  expect((await sweepNow()).resumed).toBe(1);
  expect((await harness.drain()).map((outcome) => outcome.kind)).toEqual(['waiting']);
  job = await readJob(jobId);
  expect(job.progress).toMatchObject({ done: 73, remaining: 47 });
  expect(receiver().applied()).toHaveLength(146);

  // The receiver recovers: the next resume finishes the batch.
  await receiver().setAvailability('up');
  harness.clock.set(job.waiting?.untilMs ?? 0);
  expect((await sweepNow()).resumed).toBe(1);
  const rest = await harness.drain();
  expect(rest.at(-1)?.kind).toBe('completed');

  job = await readJob(jobId);
  expect(job).toMatchObject({ status: 'completed', outcome: 'complete' });
  expect(job.progress).toEqual({ total: 120, done: 120, remaining: 0, needsAttention: 0, unknown: 0, sent: 120, logged: 120 });
  // On the receiver's side: 120 messages, one per recipient, under exactly the planned keys; 120 records.
  const perRecipient = messagesPerRecipient(receiver());
  expect(perRecipient.size).toBe(120);
  expect([...perRecipient.values()].every((count) => count === 1)).toBe(true);
  expect(new Set(receiver().applied('message').map((application) => application.key))).toEqual(new Set(plan.messages.map((message) => message.sendKey)));
  expect(receiver().applied('record')).toHaveLength(120);
  const result = await db().doc(`${JOBS}/${jobId}/results/final`).get();
  expect(result.get('title')).toBe('Renewal: 120 of 120 sent and logged');
}, 180_000); // about 500 owner-checked transactions: seconds on an idle machine, much longer on a busy one

test('cancel mid-batch: nothing new is sent after the cancel, and the reconciled report matches the receiver', async () => {
  const jobId = await harness.submit('notify', { campaign: 'Renewal', recipients: 30 }, 'owner-1');
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']); // the plan
  notify.deps.current = { ...notify.deps.current, adapter: patientAdapter() };

  // The tenth message is applied at the receiver, and its answer is held back: an effect in flight.
  const hold = gate();
  let inFlight: string | null = null;
  receiver().afterApply = async (application) => {
    if (application.kind === 'message' && receiver().applied('message').length === 10) {
      inFlight = application.key;
      await hold.promise;
    }
  };
  const [task] = harness.queue.drain();
  const worker = runStep(harness.deps(), task!.task);
  await eventually(() => inFlight !== null, 'the tenth message is in flight');

  const requestsAtCancel = receiver().requests.length;
  const applicationsAtCancel = receiver().applied().length;
  expect(applicationsAtCancel).toBe(19); // 10 messages, 9 records
  const { job: cancelled, unknownEffects } = await cancelJob(harness.store, { jobId, owner: 'owner-1', reason: 'wrong list' });
  expect(unknownEffects).toBe(1);
  expect(cancelled.cancellation?.effects).toEqual({ counts: { planned: 41, applying: 0, applied: 18, unknown: 1, failed: 0 }, settled: false, checkedWith: null, checkedAtMs: null });
  expect(cancellationReport(cancelled.cancellation!)).toContain('Effects: 18 applied, 41 not applied, 1 unknown (being checked).');

  hold.open();
  expect((await worker).kind).toBe('ownership-lost');
  // No new effects after the cancel: the receiver got no request at all once it was recorded.
  expect(receiver().requests).toHaveLength(requestsAtCancel);
  expect(receiver().applied()).toHaveLength(applicationsAtCancel);
  expect(harness.queue.tasks).toHaveLength(0);
  expect((await ledger(jobId)).find((entry) => entry.key === inFlight)?.state).toBe('unknown');

  const reconciled = await reconcileStoppedJob(harness.store, httpAdapter(receiver()), jobId, { progress: notifyProgressFromLedger });
  expect(reconciled).toMatchObject({ checked: 1, foundApplied: 1, notApplied: 0, stillUnknown: 0, effects: { counts: { applied: 19, planned: 41, unknown: 0 } } });

  const job = await readJob(jobId);
  expect(job.status).toBe('cancelled');
  // The report now counts what the receiver has: 19 applications, 41 effects never sent.
  expect(job.cancellation?.effects).toMatchObject({ counts: { applied: receiver().applied().length, planned: 41, applying: 0, unknown: 0 }, settled: true, checkedWith: 'the test receiver' });
  expect(job.effectsToSettleAtMs).toBeNull();
  const report = cancellationReport(job.cancellation!);
  expect(report).toContain(`Effects: ${receiver().applied().length} applied, 41 not applied, 0 unknown (final, checked with the test receiver).`);
  expect(report).toMatch(/cannot be undone/);
  expect(job.progress).toMatchObject({ total: 30, sent: receiver().applied('message').length, logged: receiver().applied('record').length, unknown: 0 });
  const appliedKeys = (await ledger(jobId)).filter((entry) => entry.state === 'applied').map((entry) => entry.key);
  expect(new Set(appliedKeys)).toEqual(new Set(receiver().applied().map((application) => application.key)));

  // Running it again changes nothing.
  expect(await reconcileStoppedJob(harness.store, httpAdapter(receiver()), jobId)).toMatchObject({ checked: 0, effects: { counts: { applied: 19 }, settled: true } });
});

test('a stopped job whose in-flight effect the receiver does not have: written off only after the grace period', async () => {
  const jobId = await harness.submit('notify', { campaign: 'Renewal', recipients: 2 }, 'owner-1');
  await harness.drain(1);
  notify.deps.current = { ...notify.deps.current, adapter: patientAdapter() };
  const hold = gate();
  let arrived = false;
  receiver().beforeApply = async ({ kind }) => {
    if (kind === 'message' && !arrived) {
      arrived = true;
      await hold.promise; // held before applying: the receiver never applies it once the cancel is in
    }
  };
  const [task] = harness.queue.drain();
  const worker = runStep(harness.deps(), task!.task);
  await eventually(() => arrived, 'the first message reached the receiver');
  await cancelJob(harness.store, { jobId, owner: 'owner-1', reason: 'stop' });
  receiver().inject({ op: 'apply', mode: 'fail-before-apply', times: 1 });
  hold.open();
  expect((await worker).kind).toBe('ownership-lost');
  expect(receiver().applied()).toHaveLength(0);

  const early = await reconcileStoppedJob(harness.store, httpAdapter(receiver()), jobId, { settleGraceMs: 60_000 });
  expect(early).toMatchObject({ checked: 1, notApplied: 0, stillUnknown: 1 });
  expect((await readJob(jobId)).cancellation?.effects).toMatchObject({ counts: { unknown: 1 }, settled: false, checkedWith: 'the test receiver' });
  expect(early.nextCheckAtMs).toBe(harness.clock.now() + 60_000);

  harness.clock.advance(60_000);
  const late = await reconcileStoppedJob(harness.store, httpAdapter(receiver()), jobId, { settleGraceMs: 60_000 });
  expect(late).toMatchObject({ checked: 1, notApplied: 1, stillUnknown: 0, effects: { counts: { applied: 0, failed: 1, planned: 3 }, settled: true }, nextCheckAtMs: null });
  expect(cancellationReport((await readJob(jobId)).cancellation!)).toContain('Effects: 0 applied, 4 not applied, 0 unknown (final, checked with the test receiver).');
});

describe('the receiver asks for an absurd Retry-After', () => {
  test.each([
    ['a day in seconds', '86400', 86_400_000],
    ['an HTTP date in 2100', 'Fri, 01 Jan 2100 00:00:00 GMT', Date.UTC(2100, 0, 1) - Date.now()],
    ['10^15 ms', '1000000000000', 1e15],
  ])('bug 4: Retry-After of %s pauses the job as an outage until now + the cap, with the resume time stated, and it resumes then', async (_, header, askedMs) => {
    const jobId = await harness.submit('notify', { campaign: 'Renewal', recipients: 2 });
    expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']); // the plan
    receiver().retryAfter = header;
    await receiver().setAvailability('unavailable');

    expect((await harness.drain()).map((outcome) => outcome.kind)).toEqual(['waiting']);
    const capMs = harness.options.maxServerDelaySeconds * 1000;
    expect(capMs).toBeLessThan(askedMs - 60_000);
    let job = await readJob(jobId);
    const untilMs = harness.clock.now() + capMs;
    expect(job).toMatchObject({ status: 'waiting', waiting: { reason: 'provider', questionId: UNAVAILABLE_QUESTION_ID, untilMs }, nextRunAtMs: untilMs });
    expect(job.waiting?.question).toContain(`more than the ${capMs / 1000} s cap: treated as an outage`);
    expect(job.waiting?.question).toContain(`Resuming by itself at ${new Date(untilMs).toISOString()}.`);

    // Not a moment before the stated time, and then by itself.
    harness.clock.set(untilMs - 1);
    expect((await sweepNow()).resumed).toBe(0);
    await receiver().setAvailability('up');
    harness.clock.set(untilMs);
    expect((await sweepNow()).resumed).toBe(1);
    expect((await harness.drain()).at(-1)?.kind).toBe('completed');
    job = await readJob(jobId);
    expect(job).toMatchObject({ status: 'completed', outcome: 'complete', staleReclaims: 0 });
    expect(receiver().applied('message')).toHaveLength(2);
  });

  test('bug 4: a Retry-After within the cap is honoured as it is', async () => {
    const jobId = await harness.submit('notify', { campaign: 'Renewal', recipients: 1 });
    await harness.drain(1);
    receiver().retryAfter = '300';
    await receiver().setAvailability('unavailable');
    expect((await harness.drain()).map((outcome) => outcome.kind)).toEqual(['waiting']);
    const job = await readJob(jobId);
    expect(job.waiting?.untilMs).toBe(harness.clock.now() + 300_000);
    expect(job.waiting?.question).not.toContain('treated as an outage');
  });
});
