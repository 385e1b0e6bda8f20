/**
 * The effect protocol on the emulator, through the notify pipeline and the local receiver: unknown
 * outcomes reconciled by lookup, retries under the same key, a person deciding when nobody can
 * tell, a worker killed between apply and ledger write, and the engine refusing to complete over
 * an unresolved effect.
 */
import { OwnershipLostError } from '../../functions/src/core/errors';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { decideJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import { sweep } from '../../functions/src/engine/sweeper';
import { reconcileStoppedJob } from '../../functions/src/effects/after-stop';
import { createHttpEffectAdapter } from '../../functions/src/effects/http-adapter';
import { effectEntrySchema, IN_FLIGHT_MARGIN_MS, type EffectEntry, type EffectIntent } from '../../functions/src/effects/ledger';
import type { EffectAdapter } from '../../functions/src/effects/port';
import { buildPlan, notifyInput, notifyProgressFromLedger, UNKNOWN_OPTIONS, type NotifyPlan } from '../../functions/src/pipelines/notify';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { gate } from '../support/engine';
import { applyRequestsFor, eventually, httpAdapter, messagesPerRecipient, notifySuite } from '../support/receiver';
import { hangForever } from '../support/research';
import { behaviour, testPipeline } from '../support/test-pipeline';
import { takeoverAgeMs } from '../../functions/src/core/options';

const { harness, notify, receiver } = notifySuite('effects', { others: pipelineRegistry(testPipeline) });

const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const entry = async (jobId: string, key: string): Promise<EffectEntry> => effectEntrySchema.parse((await db().doc(`${JOBS}/${jobId}/effects/${key}`).get()).data());
const eventKinds = async (jobId: string) => (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.map((doc) => doc.get('kind') as string);
const kinds = (outcomes: readonly { kind: string }[]) => outcomes.map((outcome) => outcome.kind);

async function submitNotify(recipients: number, owner = 'owner-1'): Promise<{ jobId: string; plan: NotifyPlan }> {
  const input = { campaign: 'Renewal', recipients };
  const jobId = await harness.submit('notify', input, owner);
  return { jobId, plan: buildPlan(jobId, notifyInput.parse(input)) };
}

function message(plan: NotifyPlan, index: number) {
  const found = plan.messages[index];
  if (!found) throw new Error(`no message ${index}`);
  return found;
}

function expectEachRecipientMessagedOnce(recipients: number): void {
  const perRecipient = messagesPerRecipient(receiver());
  expect(perRecipient.size).toBe(recipients);
  expect([...perRecipient.values()].every((count) => count === 1)).toBe(true);
}

test('the receiver applies and then times out: reconciled as applied from a lookup, and applied exactly once', async () => {
  const { jobId, plan } = await submitNotify(3);
  const second = message(plan, 1);
  receiver().inject({ op: 'apply', mode: 'apply-then-hang', times: 1, key: second.sendKey });

  expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'completed']);

  const settled = await entry(jobId, second.sendKey);
  const application = receiver().applied('message').find((candidate) => candidate.key === second.sendKey);
  expect(settled).toMatchObject({ state: 'applied', reconciled: true, attempts: 1, unknowns: 1, lookups: 1 });
  expect(settled.evidence).toMatchObject({ effectId: application?.effectId });
  expect(applyRequestsFor(receiver(), second.sendKey)).toBe(1);
  expectEachRecipientMessagedOnce(3);
  expect(await eventKinds(jobId)).toEqual(expect.arrayContaining(['effect-unknown', 'effect-reconciled']));
  expect((await readJob(jobId)).progress).toMatchObject({ total: 3, done: 3, remaining: 0, unknown: 0, sent: 3, logged: 3 });
});

test('the receiver fails before applying: looked up (not there), retried under the same key, applied once', async () => {
  const { jobId, plan } = await submitNotify(3);
  const second = message(plan, 1);
  receiver().inject({ op: 'apply', mode: 'fail-before-apply', times: 1, key: second.sendKey });

  expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'completed']);

  expect(await entry(jobId, second.sendKey)).toMatchObject({ state: 'applied', reconciled: false, attempts: 2, unknowns: 1, lookups: 1 });
  // Both requests for Customer 002 carried the same key (and no other key was ever used for them).
  expect(applyRequestsFor(receiver(), second.sendKey)).toBe(2);
  const messageKeys = receiver().requests.filter((request) => request.op === 'apply' && request.kind === 'message').map((request) => request.key);
  expect(messageKeys).toHaveLength(4);
  expect(new Set(messageKeys)).toEqual(new Set(plan.messages.map((planned) => planned.sendKey)));
  expectEachRecipientMessagedOnce(3);
});

describe('the receiver cannot be reached for the lookup: the job waits for its owner', () => {
  async function waitForOwner(mode: 'apply-then-hang' | 'fail-before-apply') {
    const { jobId, plan } = await submitNotify(3);
    const second = message(plan, 1);
    receiver().inject({ op: 'apply', mode, times: 1, key: second.sendKey });
    receiver().inject({ op: 'lookup', mode: 'unavailable', times: Number.POSITIVE_INFINITY });

    expect(kinds(await harness.drain())).toEqual(['handed-off', 'waiting']);
    const job = await readJob(jobId);
    expect(job.status).toBe('waiting');
    expect(job.waiting).toMatchObject({ reason: 'decision', questionId: 'unknown-effects-1', options: Object.values(UNKNOWN_OPTIONS), untilMs: null });
    const question = job.waiting?.question ?? '';
    expect(question).toContain('Done: 1 of 3');
    expect(question).toContain('Not done yet: 1');
    expect(question).toContain(`Unknown: Customer 002 <customer-002@example.test> (the message, key ${second.sendKey})`);
    expect(question).toContain('503');
    expect(job.progress).toMatchObject({ total: 3, done: 1, remaining: 1, unknown: 1, needsAttention: 0 });
    expect(await entry(jobId, second.sendKey)).toMatchObject({ state: 'unknown', question: 'unknown-effects-1' });

    // Nobody answers for a month: it is still waiting, and nothing more was sent.
    const requestsBefore = receiver().requests.filter((request) => request.op === 'apply').length;
    harness.clock.advance(30 * 24 * 3_600_000);
    await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
    expect(harness.queue.tasks).toHaveLength(0);
    expect((await readJob(jobId)).status).toBe('waiting');
    expect(receiver().requests.filter((request) => request.op === 'apply')).toHaveLength(requestsBefore);
    return { jobId, plan, second, requestsBefore };
  }

  const decide = (jobId: string, answer: string) => decideJob(harness.store, harness.queue, { jobId, owner: 'owner-1', questionId: 'unknown-effects-1', answer });

  test('"retry the unknown ones": sent again under the same key, which the receiver replays; then the rest; applied once each', async () => {
    const { jobId, second } = await waitForOwner('apply-then-hang');
    await decide(jobId, UNKNOWN_OPTIONS.retry);
    expect(kinds(await harness.drain())).toEqual(['handed-off', 'completed']);

    const settled = await entry(jobId, second.sendKey);
    expect(settled).toMatchObject({ state: 'applied', question: null, evidence: { replayed: true } });
    expect(settled.resolution).toMatch(/retried with the same key as the owner decided/);
    expect(applyRequestsFor(receiver(), second.sendKey)).toBe(2);
    expectEachRecipientMessagedOnce(3);
    expect((await readJob(jobId)).outcome).toBe('complete');
  });

  test('"mark them as not sent and continue": written off, the rest sent, a partial result that names it', async () => {
    const { jobId, second } = await waitForOwner('fail-before-apply');
    await decide(jobId, UNKNOWN_OPTIONS.markNotSent);
    expect(kinds(await harness.drain())).toEqual(['handed-off', 'completed']);

    expect(await entry(jobId, second.sendKey)).toMatchObject({ state: 'failed', resolution: expect.stringMatching(/marked not applied as the owner decided/) as unknown });
    expect(await entry(jobId, second.recordKey)).toMatchObject({ state: 'planned', attempts: 0 });
    const job = await readJob(jobId);
    expect(job).toMatchObject({ status: 'completed', outcome: 'partial', progress: { done: 2, needsAttention: 1, unknown: 0, remaining: 0, sent: 2 } });
    const result = await db().doc(`${JOBS}/${jobId}/results/final`).get();
    expect(result.get('missing')).toEqual([expect.stringContaining('Customer 002 <customer-002@example.test>: not sent')]);
    // The receiver agrees: Customer 002 never got it.
    expect([...messagesPerRecipient(receiver()).keys()].sort()).toEqual(['c001', 'c003']);
  });

  test('"stop here": the job fails with what was done, sends nothing more, and a later reconciliation settles the unknown one', async () => {
    const { jobId, second, requestsBefore } = await waitForOwner('apply-then-hang');
    await decide(jobId, UNKNOWN_OPTIONS.stop);
    expect(kinds(await harness.drain())).toEqual(['failed']);

    const job = await readJob(jobId);
    expect(job.status).toBe('failed');
    expect(job.lastError?.message).toMatch(/^Stopped as the owner decided: 1 of 3 done, 1 remaining, 0 need attention, 1 unknown \(1 messages sent\)/);
    expect(receiver().requests.filter((request) => request.op === 'apply')).toHaveLength(requestsBefore);
    expect((await entry(jobId, second.sendKey)).state).toBe('unknown');

    // Later the receiver answers lookups again: the stopped job's unknown effect is checked and recorded.
    receiver().clearFaults();
    const reconciled = await reconcileStoppedJob(harness.store, httpAdapter(receiver()), jobId, { progress: notifyProgressFromLedger });
    expect(reconciled).toMatchObject({ checked: 1, foundApplied: 1, notApplied: 0, stillUnknown: 0 });
    expect(await entry(jobId, second.sendKey)).toMatchObject({ state: 'applied', reconciled: true });
    expect((await readJob(jobId)).progress).toMatchObject({ sent: receiver().applied('message').length, unknown: 0, done: 1 });
  });
});

test('fault 9: a worker killed between apply and ledger write: the next owner reconciles it, and it is never applied twice', async () => {
  const { jobId, plan } = await submitNotify(4);
  const target = message(plan, 1).sendKey;
  const real = httpAdapter(receiver());
  let frozen = false;
  const freezing: EffectAdapter = {
    name: real.name,
    lookup: (key, signal) => real.lookup(key, signal),
    async apply(intent: EffectIntent, key: string, signal: AbortSignal) {
      const outcome = await real.apply(intent, key, signal);
      if (key === target && !frozen) {
        frozen = true;
        return hangForever(); // applied at the receiver; this worker never writes the ledger
      }
      return outcome;
    },
  };
  notify.deps.current = { ...notify.deps.current, adapter: freezing };

  expect(kinds(await harness.drain(1))).toEqual(['handed-off']); // the plan
  const [task] = harness.queue.drain();
  void runStep(harness.deps('doomed-worker'), task!.task);
  await eventually(() => receiver().applied('message').some((application) => application.key === target), 'the frozen apply reached the receiver');
  expect((await entry(jobId, target)).state).toBe('applying');

  harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
  const swept = await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  expect(swept.reclaimed).toBe(1);
  // The 20 s lease ends inside the frozen send's in-flight grace: the next owner first waits it out (one hand-off), then looks it up.
  expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'completed']);

  expect(await entry(jobId, target)).toMatchObject({ state: 'applied', reconciled: true, attempts: 1, unknowns: 1, lookups: 1 });
  expect(applyRequestsFor(receiver(), target)).toBe(1);
  expectEachRecipientMessagedOnce(4);
  // One worker lost, counted, then forgotten once the phase after it checkpointed (progress).
  expect(await readJob(jobId)).toMatchObject({ status: 'completed', staleReclaims: 0, progress: { done: 4, sent: 4, logged: 4 } });
  expect(swept.reclaimed).toBe(1);
});

describe('the ledger through the engine', () => {
  const effect: EffectIntent = { kind: 'payment', identity: 'invoice-7', target: 'acct-1', payload: { cents: 500 } };

  test('a job cannot complete while an effect is unknown: the completion is refused and names it', async () => {
    let key = '';
    behaviour.second = async (context) => {
      const [planned] = await context.effects.plan([effect]);
      key = planned!.key;
      await context.effects.transition(key, ['planned'], { state: 'applying', countAttempt: true, lastOutcome: 'sending' });
      return { kind: 'done', state: { total: 0 } };
    };
    const jobId = await harness.submit('two-phase', { sections: 1 });
    expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'failed']);
    const job = await readJob(jobId);
    expect(job.lastError?.message).toContain(`Cannot complete while effects are unresolved (applying or unknown): ${key}`);
    expect((await db().collection(`${JOBS}/${jobId}/results`).get()).size).toBe(0);
  });

  test('ledger writes are owner-checked: after a reclaim, the old worker can neither plan nor move an entry', async () => {
    const hold = gate();
    const attempts: unknown[] = [];
    let calls = 0;
    behaviour.first = async (context) => {
      calls += 1;
      if (calls === 1) {
        await hold.promise;
        attempts.push(await context.effects.plan([effect]).catch((error: unknown) => error));
      }
      return { kind: 'done', state: { sections: 1 } };
    };
    const jobId = await harness.submit('two-phase', { sections: 1 });
    const [task] = harness.queue.drain();
    const oldWorker = runStep(harness.deps('old'), task!.task);
    await eventually(async () => (await readJob(jobId)).status === 'running', 'the old worker claimed the job');
    harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
    expect((await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now())).reclaimed).toBe(1);
    expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'completed']);

    hold.open();
    expect((await oldWorker).kind).toBe('ownership-lost');
    expect(attempts[0]).toBeInstanceOf(OwnershipLostError);
    expect((await db().collection(`${JOBS}/${jobId}/effects`).get()).size).toBe(0);
  });
});

describe('a live holder inside a slow send is taken over', () => {
  /**
   * Worker A sends the first message through an adapter whose request is slow to leave (held at
   * `release`); its renewals stall, and 11 s later the same task, redelivered, takes the job over.
   * `arrives`: whether A's request then reaches the receiver (applied there) or is lost on the way.
   */
  async function takenOverMidSend(arrives: boolean) {
    const { jobId, plan } = await submitNotify(2);
    const first = message(plan, 0).sendKey;
    const real = createHttpEffectAdapter({ baseUrl: receiver().url, timeoutMs: 30_000, name: 'the test receiver' });
    const release = gate();
    let held = false;
    const slow: EffectAdapter = {
      name: real.name,
      ...(real.sendTimeoutMs === undefined ? {} : { sendTimeoutMs: real.sendTimeoutMs }),
      lookup: (key, signal) => real.lookup(key, signal),
      async apply(intent, key, signal) {
        if (key === first && !held) {
          held = true;
          await release.promise;
          if (!arrives) return { kind: 'unknown', reason: 'the connection dropped before the request left' };
          // The request had left A before it stalled: A's signal (aborted once its lease lapsed) can no longer call it back.
          return real.apply(intent, key, new AbortController().signal);
        }
        return real.apply(intent, key, signal);
      },
    };
    notify.deps.current = { ...notify.deps.current, adapter: slow };
    expect(kinds(await harness.drain(1))).toEqual(['handed-off']); // the plan
    const [task] = harness.queue.drain();
    const holderA = runStep(harness.deps('worker-a'), task!.task);
    await eventually(() => held, 'worker A is inside its send');
    const sendStartedMs = (await entry(jobId, first)).updatedAtMs;
    expect((await entry(jobId, first)).state).toBe('applying');

    // No heartbeat past the takeover age (12 s on the defaults): the redelivered task takes over and must wait the send out.
    harness.clock.advance(takeoverAgeMs(harness.options) + 1_000);
    const takerB = await runStep(harness.deps('worker-b'), task!.task);
    const graceEndsMs = sendStartedMs + 30_000 + IN_FLIGHT_MARGIN_MS;
    const whileInFlight = {
      taker: takerB.kind,
      requestsForIt: receiver().requests.filter((request) => request.key === first).length,
      entry: (await entry(jobId, first)).state,
      job: await readJob(jobId).then((job) => ({ status: job.status, nextRunAtMs: job.nextRunAtMs })),
      dispatchedDelayMs: harness.queue.tasks.map((queued) => queued.delaySeconds * 1000),
    };
    expect(whileInFlight).toEqual({
      taker: 'handed-off',
      requestsForIt: 0,
      entry: 'applying',
      job: { status: 'queued', nextRunAtMs: graceEndsMs },
      dispatchedDelayMs: [graceEndsMs - harness.clock.now()],
    });

    // A's request now reaches the receiver (or is lost); A can record nothing: its claim is gone.
    release.open();
    expect((await holderA).kind).toBe('ownership-lost');
    // The next step runs at the end of the grace: only now does anyone look the effect up.
    expect(kinds(await harness.drain())).toEqual(['handed-off', 'completed']);
    return { jobId, first };
  }

  test('bug 26: the taker waits out the send before any lookup or send; then the lookup finds it applied, never sent again', async () => {
    const { jobId, first } = await takenOverMidSend(true);
    expect(applyRequestsFor(receiver(), first)).toBe(1);
    expect(await entry(jobId, first)).toMatchObject({ state: 'applied', reconciled: true, attempts: 1, lookups: 1 });
    expectEachRecipientMessagedOnce(2);
    expect(await eventKinds(jobId)).toContain('effect-in-flight');
  });

  test('bug 26: the taker waits out the send before any lookup or send; then the lookup does not find it, and it is sent once under the same key', async () => {
    const { jobId, first } = await takenOverMidSend(false);
    expect(applyRequestsFor(receiver(), first)).toBe(1);
    expect(await entry(jobId, first)).toMatchObject({ state: 'applied', reconciled: false, attempts: 2, lookups: 1 });
    expectEachRecipientMessagedOnce(2);
  });
});
