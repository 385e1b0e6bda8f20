/**
 * A woken zombie starts nothing (the chaos soak's hole, seed a1): a holder that was frozen past the
 * stale-takeover age wakes with its work's answers already in hand; before it starts its next model
 * or tool call it checks the claim's signal, and that check aborts it, because its last confirmed
 * renewal is too old on its own clock. It stops at the stale age (holderStopAgeMs), and a taker
 * takes over only the clock-skew allowance later (takeoverAgeMs), so a taker whose clock runs ahead
 * by up to that allowance still finds it stopped. A live holder whose renewals are confirmed keeps working and is never taken over.
 * Clocks injected (the holder's may run behind the taker's), heartbeats fired by hand; "a call" is
 * the phase checking its signal, as every model and tool call site does before it starts one.
 */
let afterSectionRead: () => void = () => undefined;
// The step's section read, made slow on the clock by the test that needs it (a query under load).
jest.mock('../../functions/src/store/checkpoint-reads', () => {
  const actual = jest.requireActual<typeof import('../../functions/src/store/checkpoint-reads')>('../../functions/src/store/checkpoint-reads');
  return {
    ...actual,
    readSectionDocuments: async (...args: Parameters<typeof actual.readSectionDocuments>) => {
      const documents = await actual.readSectionDocuments(...args);
      afterSectionRead();
      return documents;
    },
  };
});
import type { Clock } from '../../functions/src/core/clock';
import { holderStopAgeMs, takeoverAgeMs } from '../../functions/src/core/options';
import { pipelineRegistry, type StepContext } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import { JobStore } from '../../functions/src/store/job-store';
import { gate, engineSuite, waitUntil } from '../support/engine';
import { behaviour, testPipeline, type TestInput } from '../support/test-pipeline';
import { ManualTimers } from '../support/timers';

const harness = engineSuite('lease-lapse', pipelineRegistry(testPipeline));

const readJob = (jobId: string) => harness.readJob(jobId);

/** The phase's calls as they start: each run of the first phase, by run number, that got past its signal check. */
function callingPhase(holdFirstRun: Promise<void>, entered: () => void) {
  const started: number[] = [];
  let runs = 0;
  behaviour.first = async (context: StepContext<TestInput>) => {
    const run = (runs += 1);
    if (run === 1) {
      entered();
      await holdFirstRun;
    }
    // What the section runner does before every model or tool call.
    context.signal.throwIfAborted();
    started.push(run);
    return { kind: 'done', state: { sections: 1 } };
  };
  return started;
}

test('a frozen holder that wakes after another worker took its claim over starts no call: the call ran once, by the new holder', async () => {
  const wake = gate();
  const entered = gate();
  const started = callingPhase(wake.promise, entered.open);
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  // Frozen: its timers never fire, so it confirms no renewal.
  const zombie = runStep(harness.deps('frozen', { timers: new ManualTimers() }), task!.task);
  await entered.promise;
  harness.clock.advance(takeoverAgeMs(harness.options));
  // A copy of its task comes (a duplicate delivery): the holder is silent for the takeover age, so it is taken over.
  const successor = await runStep(harness.deps('successor'), task!.task);
  expect(successor).toMatchObject({ kind: 'handed-off', phase: 'first' });
  expect((await readJob(jobId)).epoch).toBe(2);
  wake.open();
  const woken = await zombie;
  expect(woken.kind).toBe('ownership-lost');
  expect(woken.kind === 'ownership-lost' && woken.reason).toMatch(new RegExp(`no renewal confirmed for ${takeoverAgeMs(harness.options) / 1000} s`));
  expect(started).toEqual([2]);
});

test('a holder silent for its stop age (the takeover age less the skew allowance) stops before its next call even when nobody took over yet (it cannot know)', async () => {
  const wake = gate();
  const entered = gate();
  const started = callingPhase(wake.promise, entered.open);
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  const holder = runStep(harness.deps('frozen', { timers: new ManualTimers() }), task!.task);
  await entered.promise;
  harness.clock.advance(holderStopAgeMs(harness.options) - 1);
  expect((await readJob(jobId)).lease?.worker).toBe('frozen');
  harness.clock.advance(1);
  wake.open();
  // Nobody took over, so the holder's give-back lands: queued at once with its task, counted as a lost worker.
  expect((await holder).kind).toBe('stalled');
  expect(started).toEqual([]);
  const after = await readJob(jobId);
  expect(after).toMatchObject({ status: 'queued', lease: null, staleReclaims: 1 });
  expect(harness.queue.tasks.map((queued) => queued.task)).toEqual([expect.objectContaining({ jobId, step: after.step })]);
});

test('bug 39: a live holder whose heartbeat fires late (a stall past the takeover age) gives the job back at once; it is never left running under a lease nobody holds', async () => {
  const timers = new ManualTimers();
  const proceed = gate();
  const entered = gate();
  const started = callingPhase(proceed.promise, entered.open);
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  const holder = runStep(harness.deps('live', { timers }), task!.task);
  await entered.promise;
  // The heartbeat due at 5 s fires at 10 s: its renewal lands, but the calls have stopped on the lapse.
  harness.clock.advance(harness.options.staleHeartbeatSeconds * 1000);
  // The heartbeat re-arms after its last flush settled: fire it only once it is set again.
  await waitUntil(() => Promise.resolve(timers.size > 0));
  timers.fireAll();
  const now = harness.clock.now();
  await waitUntil(async () => (await readJob(jobId)).lease?.renewedAtMs === now);
  proceed.open();
  expect((await holder).kind).toBe('stalled');
  expect(started).toEqual([]);
  const after = await readJob(jobId);
  expect(after).toMatchObject({ status: 'queued', lease: null, staleReclaims: 1 });
  // Its task is queued now: the next worker goes on without waiting for the lease to expire and a sweep.
  const [next] = harness.queue.drain();
  expect(next?.task).toMatchObject({ jobId, step: after.step });
  expect(await runStep(harness.deps('next'), next!.task)).toMatchObject({ kind: 'handed-off', phase: 'first' });
});

test('a live holder whose renewals are confirmed keeps starting calls long past the takeover age', async () => {
  const timers = new ManualTimers();
  const proceed = gate();
  const entered = gate();
  const started = callingPhase(proceed.promise, entered.open);
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  const holder = runStep(harness.deps('live', { timers }), task!.task);
  await entered.promise;
  for (let beat = 0; beat < 6; beat += 1) {
    harness.clock.advance(harness.options.heartbeatSeconds * 1000);
    // The heartbeat re-arms after its last flush settled: fire it only once it is set again.
    await waitUntil(() => Promise.resolve(timers.size > 0));
    timers.fireAll();
    const now = harness.clock.now();
    await waitUntil(async () => (await readJob(jobId)).lease?.renewedAtMs === now);
  }
  // 30 s after the claim, 0 s after the last confirmed renewal.
  proceed.open();
  expect(await holder).toMatchObject({ kind: 'handed-off', phase: 'first' });
  expect(started).toEqual([1]);
});

/** The engine's store on a clock `behindMs` behind the harness's (the taker's): the holder's own clock. */
function storeBehind(behindMs: number): JobStore {
  const clock: Clock = { now: () => harness.clock.now() - behindMs };
  return new JobStore(harness.firestore.db, clock, harness.options, harness.queue);
}

test("bug 40: a frozen holder whose clock is behind the taker's by the skew allowance wakes after the take-over and starts no call", async () => {
  const skewMs = harness.options.clockSkewSeconds * 1000;
  expect(skewMs).toBeGreaterThan(0);
  const wake = gate();
  const entered = gate();
  const started = callingPhase(wake.promise, entered.open);
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  // The job is due on the holder's clock too.
  harness.clock.advance(skewMs);
  // Claims with a heartbeat stamped on its own (slow) clock, then freezes: no renewal is confirmed.
  const zombie = runStep(harness.deps('slow-clock', { store: storeBehind(skewMs), timers: new ManualTimers() }), task!.task);
  await entered.promise;
  // The taker's clock reads the takeover age first: on the holder's, only the takeover age less the skew has passed.
  harness.clock.advance(takeoverAgeMs(harness.options) - skewMs);
  const successor = await runStep(harness.deps('successor'), task!.task);
  expect(successor).toMatchObject({ kind: 'handed-off', phase: 'first' });
  expect((await readJob(jobId)).epoch).toBe(2);
  wake.open();
  const woken = await zombie;
  // Only the new holder's call started.
  expect(started).toEqual([2]);
  expect(woken.kind).toBe('ownership-lost');
  // It stopped on its own guard, not on a refused commit after the call.
  expect(woken.kind === 'ownership-lost' && woken.reason).toMatch(new RegExp(`no renewal confirmed for ${holderStopAgeMs(harness.options) / 1000} s`));
});

test("a live holder whose clock is behind the taker's by the skew allowance is neither stopped nor taken over while its renewals are confirmed", async () => {
  const skewMs = harness.options.clockSkewSeconds * 1000;
  const timers = new ManualTimers();
  const proceed = gate();
  const entered = gate();
  const started = callingPhase(proceed.promise, entered.open);
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  harness.clock.advance(skewMs);
  const holder = runStep(harness.deps('slow-clock', { store: storeBehind(skewMs), timers }), task!.task);
  await entered.promise;
  for (let beat = 0; beat < 4; beat += 1) {
    harness.clock.advance(harness.options.heartbeatSeconds * 1000);
    // Just before the heartbeat lands, a copy of the task finds the holder silent a heartbeat plus the skew: not yet due.
    expect(await runStep(harness.deps('taker'), task!.task)).toMatchObject({ kind: 'not-yet-due' });
    await waitUntil(() => Promise.resolve(timers.size > 0));
    timers.fireAll();
    const stamped = harness.clock.now() - skewMs;
    await waitUntil(async () => (await readJob(jobId)).lease?.renewedAtMs === stamped);
  }
  proceed.open();
  expect(await holder).toMatchObject({ kind: 'handed-off', phase: 'first' });
  expect(started).toEqual([1]);
  expect((await readJob(jobId)).epoch).toBe(1);
});

test("bug 49: a live holder whose step loads take longer than a heartbeat renews as soon as they are done: its first heartbeat counts from the claim, not from the loads", async () => {
  const heartbeatMs = harness.options.heartbeatSeconds * 1000;
  // Loads that take more than the stop age leaves after one heartbeat (10 - 5 s on the defaults).
  const loadMs = holderStopAgeMs(harness.options) - heartbeatMs + 1_000;
  afterSectionRead = () => harness.clock.advance(loadMs);
  const timers = new ManualTimers();
  const proceed = gate();
  const entered = gate();
  const started = callingPhase(proceed.promise, entered.open);
  try {
    const jobId = await harness.submit('two-phase', { sections: 1 });
    const [task] = harness.queue.drain();
    const claimedAt = harness.clock.now();
    const holder = runStep(harness.deps('live', { timers }), task!.task);
    await entered.promise;
    afterSectionRead = () => undefined;
    // The first heartbeat fires when it is due, and is confirmed at once.
    await waitUntil(() => Promise.resolve(timers.size > 0));
    const [dueInMs = Number.NaN] = timers.pendingDelays;
    harness.clock.advance(dueInMs);
    timers.fireAll();
    const now = harness.clock.now();
    await waitUntil(async () => (await readJob(jobId)).lease?.renewedAtMs === now);
    // Due a heartbeat after the claim: already past when the loads ended, so at once.
    expect(now - claimedAt).toBe(loadMs);
    proceed.open();
    expect(await holder).toMatchObject({ kind: 'handed-off', phase: 'first' });
    expect(started).toEqual([1]);
  } finally {
    afterSectionRead = () => undefined;
  }
});
