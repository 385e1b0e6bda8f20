/**
 * Recovery in seconds, still fenced (issue 12): a redelivered task that finds its own step held
 * by a worker whose heartbeat is stale takes over at once with a new epoch; a fresh heartbeat
 * asks for a later redelivery; a step that shows no progress stops renewing its lease and gives
 * the job back. Clock injected, timers fired by hand; a dead worker is a promise that never settles.
 */
import { z } from 'zod';
import { defineFanOutPhase, definePhase, definePipeline, pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import { dueRecheckMs, dueWaitLimitMs, runStepWhenDue } from '../../functions/src/engine/step/due-wait';
import { decodeJob, decodeUnit } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import type { RecordedTask } from '../support/task-queue';
import { engineSuite } from '../support/engine';
import { ManualTimers } from '../support/timers';
import { takeoverAgeMs } from '../../functions/src/core/options';

type Input = { units: number };
const input = z.strictObject({ units: z.number().int().min(0).max(3) });
const hangForever = () => new Promise<never>(() => undefined);

const control = { hangs: 0, unitHangs: 0, sectionRuns: 0, lateWrite: null as (() => Promise<void>) | null };

const work = definePhase<Input, { sections: number }>({
  name: 'work',
  state: z.strictObject({ sections: z.number() }),
  section: z.strictObject({ n: z.number() }),
  run: async (context) => {
    if (control.hangs > 0) {
      control.hangs -= 1;
      // A tool call that never comes back.
      await hangForever();
    }
    control.sectionRuns += 1;
    await context.recordSection('s0', { n: 1 });
    return { kind: 'done', state: { sections: context.sections().length } };
  },
});

const spread = defineFanOutPhase<Input, { total: number }, { n: number }>({
  name: 'spread',
  state: z.strictObject({ total: z.number() }),
  needs: [work],
  fanOut: {
    units: (context) => Array.from({ length: context.input.units }, (_, index) => `u${index}`),
    unitState: z.strictObject({ n: z.number() }),
    runUnit: async () => {
      if (control.unitHangs > 0) {
        control.unitHangs -= 1;
        await hangForever();
      }
      return { kind: 'done', state: { n: 1 } };
    },
    join: (results) => ({ total: results.size }),
  },
});

const pipeline = definePipeline<Input>({
  name: 'recovering',
  description: 'Test pipeline: a sectioned phase that may hang, then a fan-out whose units may hang',
  input,
  phases: [work, spread],
  publish: () => ({ outcome: 'complete', title: 'Recovered', markdown: 'done', missing: [] }),
});

const harness = engineSuite('recovery', pipelineRegistry(pipeline), {
  beforeEach: () => {
    control.hangs = 0;
    control.unitHangs = 0;
    control.sectionRuns = 0;
  },
});

const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const events = async (jobId: string) => (await db().collection(`${JOBS}/${jobId}/events`).orderBy('atMs').get()).docs.map((doc) => ({ kind: doc.get('kind') as string, message: doc.get('message') as string }));

async function until(probe: () => Promise<boolean>): Promise<void> {
  for (let tries = 0; tries < 4_000; tries += 1) {
    if (await probe()) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  throw new Error('condition never held');
}

/** A live worker's pipeline: its one phase reports progress, then waits until the test releases it. */
function gatedPipeline(): { slow: ReturnType<typeof definePipeline<Input>>; release: () => void } {
  let release: () => void = () => undefined;
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  const slow = definePipeline<Input>({
    name: 'recovering',
    description: 'Test pipeline: a phase that reports progress while it waits on a gate',
    input,
    phases: [
      definePhase<Input, { sections: number }>({
        name: 'work',
        state: z.strictObject({ sections: z.number() }),
        run: async (context) => {
          context.reportProgress({ waiting: 1 });
          await gate;
          return { kind: 'done', state: { sections: 0 } };
        },
      }),
    ],
    publish: () => ({ outcome: 'complete', title: 'Slow', markdown: 'done', missing: [] }),
  });
  return { slow, release };
}

/** Starts the next task on a worker that will hang; returns the task so the test can redeliver it. */
async function startDoomed(jobId: string): Promise<RecordedTask> {
  const task = harness.queue.tasks.shift();
  if (!task) throw new Error('no task');
  const before = (await readJob(jobId)).epoch;
  void runStep(harness.deps('doomed'), task.task);
  await until(async () => (await readJob(jobId)).epoch > before);
  return task;
}

describe('a task that comes early waits in its request for its claim to come due', () => {
  /** Settles when the step has set its next timer (the wait in its request) or finished. */
  async function nextWait(timers: ManualTimers, step: Promise<unknown>): Promise<number[]> {
    let finished = false;
    void step.then(
      () => (finished = true),
      () => (finished = true),
    );
    await until(() => Promise.resolve(finished || timers.size > 0));
    return timers.pendingDelays;
  }

  test("a killed worker's task, delivered again while the heartbeat is fresh, waits until the holder may be taken over and takes it, without a redelivery", async () => {
    control.hangs = 1;
    const jobId = await harness.submit('recovering', { units: 0 });
    const task = await startDoomed(jobId);
    harness.clock.advance(5_000);

    const timers = new ManualTimers();
    const step = runStepWhenDue(harness.deps('redelivery', { timers }), task.task);
    // Waits for the rest of the take-over age, looking again at least every recheck interval; Cloud Tasks is not asked to deliver it again.
    const needMs = takeoverAgeMs(harness.options) - 5_000;
    const waits: number[] = [];
    // (Once it took over, the same timers carry its own heartbeat: only the waits before that are counted.)
    for (let leftMs = needMs; leftMs > 0; ) {
      const delays = await nextWait(timers, step);
      expect(delays).toHaveLength(1);
      expect(await readJob(jobId)).toMatchObject({ status: 'running', epoch: 1 });
      waits.push(delays[0]!);
      harness.clock.advance(delays[0]!);
      leftMs -= delays[0]!;
      timers.fireAll();
    }
    expect(waits.reduce((sum, ms) => sum + ms, 0)).toBe(needMs);
    expect(Math.max(...waits)).toBeLessThanOrEqual(dueRecheckMs(harness.options));
    expect(await step).toEqual({ outcome: { kind: 'handed-off', phase: 'work', checkpointed: true }, waitedMs: needMs, claimTries: waits.length + 1 });
    expect(await readJob(jobId)).toMatchObject({ status: 'queued', epoch: 2 });
  });

  test('a wait longer than the limit is not made: the task asks for a redelivery at once, as before', async () => {
    control.hangs = 1;
    const jobId = await harness.submit('recovering', { units: 0 });
    const task = await startDoomed(jobId);
    harness.clock.advance(1_000);
    const timers = new ManualTimers();
    const needed = takeoverAgeMs(harness.options) - 1_000;
    const step = runStepWhenDue(harness.deps('redelivery', { timers }), task.task, needed - 1);
    expect(await nextWait(timers, step)).toEqual([]);
    expect(await step).toEqual({ outcome: { kind: 'not-yet-due', retryAfterMs: needed }, waitedMs: 0, claimTries: 1 });
    expect(dueWaitLimitMs(harness.options)).toBe(takeoverAgeMs(harness.options));
    // The wait never eats into the step budget's room under the function's timeout (540 s): a quarter of it at most.
    expect(dueWaitLimitMs({ ...harness.options, staleHeartbeatSeconds: 240, stepBudgetSeconds: 300 })).toBe(60_000);
  });

  test("a live holder's duplicate task waits about one heartbeat, sees the renewal, and is acknowledged, not sent back; the holder keeps its claim", async () => {
    const { slow, release } = gatedPipeline();
    const holderTimers = new ManualTimers();
    const jobId = await harness.submit('recovering', { units: 0 });
    const task = harness.queue.tasks.shift()!;
    const running = runStep({ ...harness.deps('alive', { timers: holderTimers }), pipelines: pipelineRegistry(slow) }, task.task);
    await until(async () => (await readJob(jobId)).status === 'running');

    const timers = new ManualTimers();
    const duplicate = runStepWhenDue({ ...harness.deps('duplicate', { timers }), pipelines: pipelineRegistry(slow) }, task.task);
    const recheckMs = dueRecheckMs(harness.options);
    let waitedMs = 0;
    for (;;) {
      const delays = await nextWait(timers, duplicate);
      if (delays.length === 0) break;
      // While the duplicate waits, the holder renews its lease (a heartbeat every heartbeatSeconds).
      const waitMs = delays[0]!;
      waitedMs += waitMs;
      for (let left = waitMs; left > 0; ) {
        const stepMs = Math.min(left, harness.options.heartbeatSeconds * 1000);
        await until(() => Promise.resolve(holderTimers.size > 0));
        harness.clock.advance(stepMs);
        holderTimers.fireAll();
        await until(async () => (await readJob(jobId)).lease?.renewedAtMs === harness.clock.now());
        left -= stepMs;
      }
      timers.fireAll();
    }
    // One wait: the renewal that followed it showed the holder alive, so the task is not needed (the holder has its own).
    expect(await duplicate).toMatchObject({ outcome: { kind: 'not-claimable', reason: expect.stringMatching(/another worker's to run: its due time moved/) as unknown }, waitedMs, claimTries: 2 });
    expect(waitedMs).toBeGreaterThan(0);
    expect(waitedMs).toBeLessThanOrEqual(recheckMs);
    release();
    expect((await running).kind).toBe('handed-off');
    expect((await readJob(jobId)).epoch).toBe(1);
  });
});

describe('a redelivered task takes over a job whose worker went silent', () => {
  test('a redelivery while the heartbeat is fresh asks to come back when it would be stale; after that it takes over with a new epoch', async () => {
    control.hangs = 1;
    const jobId = await harness.submit('recovering', { units: 0 });
    const task = await startDoomed(jobId);

    harness.clock.advance(5_000);
    const early = await runStep(harness.deps('redelivery-1'), task.task);
    expect(early).toEqual({ kind: 'not-yet-due', retryAfterMs: takeoverAgeMs(harness.options) - 5_000 });
    expect(await readJob(jobId)).toMatchObject({ status: 'running', epoch: 1, staleReclaims: 0 });

    harness.clock.advance(takeoverAgeMs(harness.options) - 5_000);
    const takeover = await runStep(harness.deps('redelivery-2'), task.task);
    expect(takeover).toEqual({ kind: 'handed-off', phase: 'work', checkpointed: true });
    const job = await readJob(jobId);
    // Taken over with a new epoch and counted; the checkpoint that followed is progress and reset the count.
    expect(job).toMatchObject({ status: 'queued', epoch: 2, staleReclaims: 0 });
    expect((await events(jobId)).find((event) => event.kind === 'reclaimed')?.message).toContain(`no heartbeat from doomed (epoch 1) for ${takeoverAgeMs(harness.options) / 1000} s`);
    await harness.drain();
    expect(await readJob(jobId)).toMatchObject({ status: 'completed' });
    // The recovery waited the stale-heartbeat threshold, not the lease and a sweep.
    expect(takeoverAgeMs(harness.options)).toBeLessThan(harness.options.leaseSeconds * 1000);
  });

  test('a worker that keeps heartbeating is never taken over, however often its task is redelivered', async () => {
    const timers = new ManualTimers();
    control.hangs = 0;
    const { slow, release } = gatedPipeline();
    const jobId = await harness.submit('recovering', { units: 0 });
    const task = harness.queue.tasks.shift()!;
    const running = runStep({ ...harness.deps('alive', { timers }), pipelines: pipelineRegistry(slow) }, task.task);
    await until(async () => (await readJob(jobId)).status === 'running');
    for (let round = 0; round < 6; round += 1) {
      await until(() => Promise.resolve(timers.size > 0)); // the heartbeat is armed
      harness.clock.advance(harness.options.heartbeatSeconds * 1000);
      timers.fireAll();
      await until(async () => (await readJob(jobId)).lease?.renewedAtMs === harness.clock.now());
      const redelivered = await runStep(harness.deps('redelivery'), task.task);
      expect(redelivered.kind).toBe('not-yet-due');
    }
    release();
    expect((await running).kind).toBe('handed-off');
    expect((await readJob(jobId)).epoch).toBe(1);
  });

  test('the old worker, taken over, can write nothing: its late section is refused', async () => {
    const lateWrite = { run: null as null | (() => Promise<void>) };
    let wake: () => void = () => undefined;
    const woken = new Promise<void>((resolve) => {
      wake = resolve;
    });
    const sleepy = definePipeline<Input>({
      name: 'recovering',
      description: 'Test pipeline: a worker that sleeps past the takeover and then writes',
      input,
      phases: [
        definePhase<Input, { sections: number }>({
          name: 'work',
          state: z.strictObject({ sections: z.number() }),
          section: z.strictObject({ n: z.number() }),
          run: async (context) => {
            if (lateWrite.run === null) {
              lateWrite.run = () => context.recordSection('late', { n: 99 });
              await woken;
              await lateWrite.run();
            }
            return { kind: 'done', state: { sections: context.sections().length } };
          },
        }),
      ],
      publish: () => ({ outcome: 'complete', title: 'Sleepy', markdown: 'done', missing: [] }),
    });
    const deps = (worker: string) => ({ ...harness.deps(worker), pipelines: pipelineRegistry(sleepy) });
    const jobId = await harness.submit('recovering', { units: 0 });
    const task = harness.queue.tasks.shift()!;
    const sleeping = runStep(deps('sleeper'), task.task);
    await until(() => Promise.resolve(lateWrite.run !== null));
    harness.clock.advance(takeoverAgeMs(harness.options));
    // The new owner is held mid-step (running, epoch 2) while the old one wakes and writes.
    expect((await runStep(deps('taker'), task.task)).kind).toBe('handed-off');
    wake();
    expect((await sleeping).kind).toBe('ownership-lost');
    expect((await db().collection(`${JOBS}/${jobId}/sections`).get()).size).toBe(0);
  });

  test('a unit task redelivered after its worker went silent takes the unit over', async () => {
    control.unitHangs = 1;
    const jobId = await harness.submit('recovering', { units: 2 });
    await harness.drain(2); // work, then the fan-out
    const unitTask = harness.queue.tasks.find((task) => task.task.unit === 'u0')!;
    harness.queue.tasks.splice(harness.queue.tasks.indexOf(unitTask), 1);
    void runStep(harness.deps('doomed'), unitTask.task);
    await until(async () => decodeUnit('u', (await db().doc(`${JOBS}/${jobId}/units/spread~u0`).get()).data()).status === 'running');
    expect((await runStep(harness.deps('redelivery'), unitTask.task)).kind).toBe('not-yet-due');
    harness.clock.advance(takeoverAgeMs(harness.options));
    expect(await runStep(harness.deps('redelivery'), unitTask.task)).toMatchObject({ kind: 'unit-done', unit: 'u0' });
    await harness.drain();
    expect(await readJob(jobId)).toMatchObject({ status: 'completed' });
    expect((await events(jobId)).some((event) => event.kind === 'reclaimed' && /Unit u0 reclaimed/.test(event.message))).toBe(true);
  });

  test('a job whose workers keep going silent in the same step is quarantined by the takeover rule', async () => {
    control.hangs = 10;
    const jobId = await harness.submit('recovering', { units: 0 });
    const task = await startDoomed(jobId);
    for (let loss = 1; loss <= harness.options.maxStaleReclaims + 1; loss += 1) {
      harness.clock.advance(takeoverAgeMs(harness.options));
      const outcome = await Promise.race([runStep(harness.deps(`redelivery-${loss}`), task.task), new Promise((resolve) => setTimeout(() => resolve('hung'), 1_500))]);
      if (loss <= harness.options.maxStaleReclaims) expect(outcome).toBe('hung');
      else expect(outcome).toMatchObject({ kind: 'not-claimable' });
    }
    const job = await readJob(jobId);
    expect(job).toMatchObject({ status: 'quarantined', staleReclaims: harness.options.maxStaleReclaims + 1 });
  });
});

describe('progress, not a timer, keeps a lease alive', () => {
  test('a step wedged on a tool that never returns stops renewing, gives the job back, and the job completes on the next worker', async () => {
    const timers = new ManualTimers();
    control.hangs = 1;
    const jobId = await harness.submit('recovering', { units: 0 });
    const task = harness.queue.tasks.shift()!;
    const stuck = runStep(harness.deps('wedged', { timers }), task.task);
    await until(async () => (await readJob(jobId)).status === 'running');

    // Heartbeats within the bound renew the lease (the claim counts as the last progress).
    await until(() => Promise.resolve(timers.size > 0));
    harness.clock.advance(harness.options.heartbeatSeconds * 1000);
    timers.fireAll();
    await until(async () => (await readJob(jobId)).lease?.renewedAtMs === harness.clock.now());

    // Past the bound, the next heartbeat does not renew: the step aborts itself and gives the job back.
    await until(() => Promise.resolve(timers.size > 0));
    harness.clock.advance(harness.options.progressTimeoutSeconds * 1000);
    timers.fireAll();
    const outcome = await stuck;
    expect(outcome.kind).toBe('stalled');
    const job = await readJob(jobId);
    expect(job).toMatchObject({ status: 'queued', staleReclaims: 1, lease: null });
    expect((await events(jobId)).find((event) => event.kind === 'reclaimed')?.message).toMatch(/no progress for \d+ s \(limit 150 s\)/);
    await harness.drain();
    expect(await readJob(jobId)).toMatchObject({ status: 'completed' });
    expect(control.sectionRuns).toBe(1);
  });
});
