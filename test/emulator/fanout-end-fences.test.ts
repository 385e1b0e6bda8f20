/**
 * A commit that ends a fan-out decides from the fan-out's units as read beside the job: it must be
 * conditioned on every one of them, charged or not, so a unit that records cost after the read fails
 * the commit (decided again with it) instead of losing that cost when its claim is revoked.
 */
import type { JobRecord } from '../../functions/src/core/job';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob, decodeUnit, type UnitRecord } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { engineHarness, type EngineHarness } from '../support/engine';
import { heldUnitsPipeline, hold } from '../support/held-units';
import type { RecordedTask } from '../support/task-queue';
import { ManualTimers } from '../support/timers';

const { pipeline: probeUnits, turns } = heldUnitsPipeline('probe-units');

let harness: EngineHarness;
beforeAll(() => {
  harness = engineHarness('fanout-end-fences', pipelineRegistry(probeUnits));
});
beforeEach(async () => {
  turns.reset();
  harness.queue.drain();
  await harness.firestore.reset();
});
afterAll(() => harness.firestore.close());

const db = () => harness.firestore.db;
const readJob = async (jobId: string): Promise<JobRecord> => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const readUnit = async (jobId: string, unit: string): Promise<UnitRecord> => decodeUnit(`${JOBS}/${jobId}/units/experts~${unit}`, (await db().doc(`${JOBS}/${jobId}/units/experts~${unit}`).get()).data());
const unitTask = (tasks: readonly RecordedTask[], unit: string): RecordedTask => {
  const task = tasks.find((candidate) => candidate.task.unit === unit);
  if (!task) throw new Error(`no task for ${unit}`);
  return task;
};
const run = (task: RecordedTask, worker: string, timers: ManualTimers): Promise<StepOutcome> => runStep(harness.deps(worker, { timers }), task.task);

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
  const jobId = await harness.submit('probe-units', { units: 2 });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  const tasks = harness.queue.drain();
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
