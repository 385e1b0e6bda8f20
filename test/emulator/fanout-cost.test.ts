/**
 * A fan-out's cost: the job's cost is its own plus every unit's recorded cost, counted once. A
 * fan-out that ends early (a unit fails, the owner cancels, a unit makes the job wait or quarantines
 * it) charges every unit in the commit that ends it, not only the unit that ended it; a fan-out
 * started again afterwards adds only what it spends itself.
 */
import { RetryableError, TerminalError } from '../../functions/src/core/errors';
import type { JobRecord } from '../../functions/src/core/job';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { redriveJob, releaseQuarantined } from '../../functions/src/engine/operator';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob, decodeUnit, type UnitRecord } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { heldUnitsPipeline, hold } from '../support/held-units';
import type { RecordedTask } from '../support/task-queue';
import { ManualTimers } from '../support/timers';

const { pipeline: costedUnits, turns } = heldUnitsPipeline('costed-units');

const harness = engineSuite('fanout-cost', pipelineRegistry(costedUnits), {
  beforeEach: () => {
    turns.reset();
  },
});

const db = () => harness.firestore.db;
const readJob = async (jobId: string): Promise<JobRecord> => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const readUnits = async (jobId: string): Promise<UnitRecord[]> => (await db().collection(`${JOBS}/${jobId}/units`).get()).docs.map((doc) => decodeUnit(doc.ref.path, doc.data()));
const sweepNow = () => sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());

function unitTask(tasks: readonly RecordedTask[], unit: string): RecordedTask {
  const task = tasks.find((candidate) => candidate.task.unit === unit);
  if (!task) throw new Error(`no task for unit ${unit}`);
  return task;
}

/** Every unit's cost, and whether the job counted all of it. */
async function unitCosts(jobId: string): Promise<{ unit: string; cost: number; counted: boolean }[]> {
  return (await readUnits(jobId))
    .map((unit) => ({ unit: unit.unit, cost: unit.cost.usd ?? 0, counted: (unit.costInJob.usd ?? 0) === (unit.cost.usd ?? 0) }))
    .sort((a, b) => a.unit.localeCompare(b.unit));
}

/** Starts a fan-out of `units` units and hands back their tasks. */
async function fanOut(units: number): Promise<{ jobId: string; tasks: RecordedTask[] }> {
  const jobId = await harness.submit('costed-units', { units });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  return { jobId, tasks: harness.queue.drain() };
}

const run = (task: RecordedTask, worker = 'worker-a', timers?: ManualTimers): Promise<StepOutcome> => runStep(harness.deps(worker, timers ? { timers } : {}), task.task);

test('bug 23: three units each record $1 and one fails: the job costs $3, every unit counted once', async () => {
  turns.run = (context, unit) => {
    context.addCost({ usd: 1 });
    if (unit === 'u1') return Promise.reject(new RetryableError('u1 fails once; it would be retried'));
    if (unit === 'u2') return Promise.reject(new TerminalError('u2 fails for good'));
    return Promise.resolve({ kind: 'done', state: { value: 1 } });
  };
  const { jobId, tasks } = await fanOut(3);
  expect((await run(unitTask(tasks, 'u0'))).kind).toBe('unit-done');
  expect((await run(unitTask(tasks, 'u1'))).kind).toBe('requeued');
  expect((await run(unitTask(tasks, 'u2'))).kind).toBe('failed');
  const job = await readJob(jobId);
  expect({ status: job.status, cost: job.cost, units: await unitCosts(jobId) }).toEqual({
    status: 'failed',
    cost: { usd: 3 },
    units: [
      { unit: 'u0', cost: 1, counted: true },
      { unit: 'u1', cost: 1, counted: true },
      { unit: 'u2', cost: 1, counted: true },
    ],
  });
});

test("bug 23: an owner's cancel mid fan-out puts every unit's recorded cost in the job: finished, backing off, and running with a heartbeat", async () => {
  const u2Held = hold();
  turns.run = async (context, unit) => {
    context.addCost({ usd: 1 });
    if (unit === 'u1') throw new RetryableError('u1 fails once; it would be retried');
    if (unit === 'u2') {
      u2Held.arrive();
      await u2Held.released;
    }
    return { kind: 'done', state: { value: 1 } };
  };
  const { jobId, tasks } = await fanOut(3);
  expect((await run(unitTask(tasks, 'u0'))).kind).toBe('unit-done');
  expect((await run(unitTask(tasks, 'u1'))).kind).toBe('requeued');
  const timers = new ManualTimers();
  const u2 = run(unitTask(tasks, 'u2'), 'worker-c', timers);
  await u2Held.entered;
  // Its heartbeat records the dollar it spent so far on the unit.
  harness.clock.advance(harness.options.heartbeatSeconds * 1000);
  timers.fireAll();
  for (let tries = 0; (await unitCosts(jobId)).find((unit) => unit.unit === 'u2')?.cost !== 1; tries += 1) {
    if (tries > 500) throw new Error('u2 never recorded its cost');
    await new Promise((resolve) => setTimeout(resolve, 5));
  }

  await cancelJob(harness.store, { jobId, owner: 'user-1', reason: 'no longer needed' });
  u2Held.release();
  expect((await u2).kind).toBe('ownership-lost');
  const job = await readJob(jobId);
  expect({ status: job.status, cost: job.cost, units: await unitCosts(jobId) }).toEqual({
    status: 'cancelled',
    cost: { usd: 3 },
    units: [
      { unit: 'u0', cost: 1, counted: true },
      { unit: 'u1', cost: 1, counted: true },
      { unit: 'u2', cost: 1, counted: true },
    ],
  });
});

test("bug 23: a unit's wait charges every unit; the fan-out started again on resume adds only what it spends", async () => {
  let waited = false;
  turns.run = (context, unit) => {
    context.addCost({ usd: 1 });
    if (unit === 'u1' && !waited) {
      waited = true;
      return Promise.resolve({ kind: 'wait', reason: 'provider', question: 'The provider is down', untilMs: harness.clock.now() + 60_000 });
    }
    if (unit === 'u0' && !waited) return Promise.reject(new RetryableError('u0 fails once'));
    return Promise.resolve({ kind: 'done', state: { value: 1 } });
  };
  const { jobId, tasks } = await fanOut(2);
  expect((await run(unitTask(tasks, 'u0'))).kind).toBe('requeued');
  expect((await run(unitTask(tasks, 'u1'))).kind).toBe('waiting');
  const waiting = await readJob(jobId);
  expect({ status: waiting.status, cost: waiting.cost }).toEqual({ status: 'waiting', cost: { usd: 2 } });

  // The old retry of u0 is refused (its fan-out ended); the sweeper resumes the job, which fans out again: both units run once more.
  harness.clock.advance(60_000);
  expect((await sweepNow()).resumed).toBe(1);
  await harness.drain();
  const job = await readJob(jobId);
  expect({ status: job.status, cost: job.cost }).toEqual({ status: 'completed', cost: { usd: 4 } });
});

test('bug 23: a unit that quarantines its job charges every unit; the released job adds only what it spends', async () => {
  const u1Held = hold();
  let released = false;
  turns.run = async (context, unit) => {
    context.addCost({ usd: 1 });
    if (unit === 'u0' && !released) throw new RetryableError('u0 fails once');
    if (unit === 'u1' && !released) {
      u1Held.arrive();
      await u1Held.released;
    }
    return { kind: 'done', state: { value: 1 } };
  };
  const { jobId, tasks } = await fanOut(2);
  expect((await run(unitTask(tasks, 'u0'))).kind).toBe('requeued');
  await db().doc(`${JOBS}/${jobId}/units/experts~u1`).update({ staleReclaims: harness.options.maxStaleReclaims, cost: { usd: 5 } });
  const silent = run(unitTask(tasks, 'u1'), 'worker-silent');
  await u1Held.entered;
  harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
  expect((await sweepNow()).quarantined).toBe(1);
  const quarantined = await readJob(jobId);
  // u0's dollar, and the five u1 recorded before its worker was lost.
  expect({ status: quarantined.status, cost: quarantined.cost }).toEqual({ status: 'quarantined', cost: { usd: 6 } });
  released = true;
  u1Held.release();
  await silent;

  await releaseQuarantined(harness.store, harness.queue, jobId, harness.clock.now(), () => undefined);
  await harness.drain();
  const job = await readJob(jobId);
  expect({ status: job.status, cost: job.cost }).toEqual({ status: 'completed', cost: { usd: 8 } });
});

test('bug 23: a release counts what units recorded and the job has not (a fan-out a quarantine left on record before quarantines ended it), once', async () => {
  turns.run = (context) => {
    context.addCost({ usd: 1 });
    return Promise.reject(new RetryableError('fails once, then the job is quarantined'));
  };
  const { jobId, tasks } = await fanOut(2);
  expect((await run(unitTask(tasks, 'u0'))).kind).toBe('requeued');
  // As a quarantine through a unit left a job before it charged the fan-out's units: u0's dollar is on the unit only.
  const before = await readJob(jobId);
  await db().doc(`${JOBS}/${jobId}`).update({ status: 'quarantined', quarantine: { reason: 'unit u1: lost too many workers', at: new Date(harness.clock.now()) } });
  expect({ cost: before.cost, fanout: before.fanout?.epoch }).toEqual({ cost: {}, fanout: before.epoch });

  const released = await releaseQuarantined(harness.store, harness.queue, jobId, harness.clock.now(), () => undefined);
  expect({ cost: released.job.cost, fanout: released.job.fanout, units: await unitCosts(jobId) }).toEqual({
    cost: { usd: 1 },
    fanout: null,
    units: [
      { unit: 'u0', cost: 1, counted: true },
      { unit: 'u1', cost: 0, counted: true },
    ],
  });
  turns.reset();
  await harness.drain();
  // The released job's fan-out runs both units again, each spending nothing more.
  expect((await readJob(jobId)).cost).toEqual({ usd: 1 });
});

test("a re-drive of a job a quarantine left with its fan-out on record counts the units' cost once too (set aside or run again)", async () => {
  turns.run = (context) => {
    context.addCost({ usd: 1 });
    return Promise.reject(new RetryableError('fails once, then the job is quarantined'));
  };
  const { jobId, tasks } = await fanOut(2);
  expect((await run(unitTask(tasks, 'u0'))).kind).toBe('requeued');
  // As the release test above: u0's dollar on the unit only, the fan-out still on record.
  await db().doc(`${JOBS}/${jobId}`).update({ status: 'quarantined', quarantine: { reason: 'unit u1: lost too many workers', at: new Date(harness.clock.now()) } });
  harness.queue.drain();

  const redriven = await redriveJob(harness.store, harness.queue, { jobId, fromPhase: 'experts', by: 'ops-ana', reason: 'probe' }, harness.clock.now(), { pipelines: pipelineRegistry(costedUnits) });
  expect(redriven.job.fanout).toBeNull();
  turns.reset();
  await harness.drain();
  const job = await readJob(jobId);
  expect({ status: job.status, cost: job.cost, units: await unitCosts(jobId) }).toEqual({
    status: 'completed',
    cost: { usd: 1 },
    units: [
      { unit: 'u0', cost: 1, counted: true },
      { unit: 'u1', cost: 0, counted: true },
    ],
  });
});

/** One unit of the fan-out, as stored. */
const readUnit = async (jobId: string, unit: string): Promise<UnitRecord> => {
  const found = (await readUnits(jobId)).find((candidate) => candidate.unit === unit);
  if (!found) throw new Error(`no unit ${unit}`);
  return found;
};

test('bug 38: a sibling unit whose heartbeat records cost between the sweeper\'s read of the fan-out and its quarantine commit is counted in the job', async () => {
  const u0Held = hold();
  const u1Held = hold();
  turns.run = async (context, unit) => {
    if (unit === 'u0') {
      context.addCost({ usd: 1 });
      u0Held.arrive();
      await u0Held.released;
    } else {
      u1Held.arrive();
      await u1Held.released;
    }
    return { kind: 'done', state: { value: 1 } };
  };
  const { jobId, tasks } = await fanOut(2);
  await db().doc(`${JOBS}/${jobId}/units/experts~u1`).update({ staleReclaims: harness.options.maxStaleReclaims });
  // u1's worker goes silent (its timers never fire) and its lease runs out.
  const u1Timers = new ManualTimers();
  const silent = run(unitTask(tasks, 'u1'), 'worker-silent', u1Timers);
  await u1Held.entered;
  harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
  // u0 is claimed now (fresh lease), has spent $1 in memory, not yet flushed: cost 0 = counted 0 on the unit.
  const u0Timers = new ManualTimers();
  const u0 = run(unitTask(tasks, 'u0'), 'worker-a', u0Timers);
  await u0Held.entered;
  expect((await readUnit(jobId, 'u0')).cost.usd ?? 0).toBe(0);

  const sweepAt = harness.clock.now();
  // Between the sweeper's read of the fan-out's units and its commit, u0's heartbeat records its $1.
  const real = harness.store.readFanOutUnits.bind(harness.store);
  let interposed = false;
  const spy = jest.spyOn(harness.store, 'readFanOutUnits').mockImplementation(async (id, epoch) => {
    const reads = await real(id, epoch);
    if (!interposed) {
      interposed = true;
      harness.clock.advance(harness.options.heartbeatSeconds * 1000);
      u0Timers.fireAll();
      for (let tries = 0; ((await readUnit(jobId, 'u0')).cost.usd ?? 0) !== 1; tries += 1) {
        if (tries > 500) throw new Error('u0 never recorded its cost');
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
    }
    return reads;
  });
  const report = await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, sweepAt);
  spy.mockRestore();
  expect(interposed).toBe(true);
  expect(report.quarantined).toBe(1);
  u0Held.release();
  u1Held.release();
  await Promise.allSettled([u0, silent]);
  const job = await readJob(jobId);
  const unit0 = await readUnit(jobId, 'u0');
  // The promise: the job's cost is its own plus every unit's recorded cost, counted once when the fan-out ends.
  expect({ status: job.status, jobCost: job.cost.usd ?? 0, u0Cost: unit0.cost.usd ?? 0, u0Counted: unit0.costInJob.usd ?? 0 }).toEqual({ status: 'quarantined', jobCost: 1, u0Cost: 1, u0Counted: 1 });
});
