/**
 * A fan-out's start is a plain read of its units and one batch conditioned on the job (and each
 * unit on the version read), not a transaction: nothing is locked while it reads. These tests put
 * other actors between that read and that commit (a unit taken over or created, the sweeper, the
 * owner's cancel, a writer that keeps changing a unit, a stale job holder): the commit fails and the
 * fan-out decides again from what is there now, never writing over it.
 */
import { CheckpointWriteError } from '../../functions/src/core/errors';
import type { UnitRecord } from '../../functions/src/core/job';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import { sweep } from '../../functions/src/engine/sweeper';
import { canaryPipeline } from '../../functions/src/pipelines/canary';
import { decodeUnit, encodeUnit } from '../../functions/src/store/codec';
import { JOBS, resultPath, unitPath } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { afterEveryGetAll, afterFirstGetAll, whileInterposed } from '../support/interpose';
import { unitRecord } from '../support/records';

const harness = engineSuite('fanout-start', pipelineRegistry(canaryPipeline));

const db = () => harness.firestore.db;
const text = 'One paragraph here.\n\nAnd a second one.';

/** A unit of the canary's fan-out phase as an earlier fan-out (epoch 0) left it: held at `epoch`, its lease expiring at `expiresAtMs` (a minute from now unless given). */
function leftoverUnit(jobId: string, epoch: number, expiresAtMs = harness.clock.now() + 60_000): UnitRecord {
  const nowMs = harness.clock.now();
  return unitRecord({ jobId, unit: 'p00', phase: 'measure', status: 'running', epoch, lease: { epoch, worker: 'earlier-worker', expiresAtMs }, nextRunAtMs: nowMs, updatedAtMs: nowMs });
}

/** The fan-out's read of its units (a getAll of unit documents only). */
const unitsOnly = (paths: readonly string[]) => paths.length > 0 && paths.every((path) => path.includes('/units/'));

test('a whole fan-out job, from its fan-out to its published answer, runs without a transaction', async () => {
  const jobId = await harness.submit('canary', { text });
  const transactions = jest.spyOn(db(), 'runTransaction');
  let kinds;
  try {
    kinds = (await harness.drain()).map((outcome) => outcome.kind);
    expect(transactions).not.toHaveBeenCalled();
  } finally {
    transactions.mockRestore();
  }
  expect(kinds).toEqual(['handed-off', 'fanned-out', 'unit-done', 'unit-done', 'handed-off', 'completed']);
  expect((await db().doc(resultPath(jobId)).get()).get('outcome')).toBe('complete');
});

test("a unit that changes between the fan-out's read and its commit is not overwritten: the fan-out decides again from the unit as it now is", async () => {
  const jobId = await harness.submit('canary', { text });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  const unitDoc = db().doc(unitPath(jobId, 'measure', 'p00'));
  await unitDoc.set(encodeUnit(leftoverUnit(jobId, 3)));
  // The earlier fan-out's worker is taken over (epoch 4) after the fan-out read the unit at epoch 3.
  const interposed = afterFirstGetAll(db(), unitsOnly, () => unitDoc.set(encodeUnit(leftoverUnit(jobId, 4))));
  const outcomes = await whileInterposed(interposed, () => harness.drain(1));
  expect(interposed.ran()).toBe(true);
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  const unit = decodeUnit(unitDoc.path, (await unitDoc.get()).data());
  // Written over the read at epoch 3, the unit's next claim would reuse epoch 4, the taken-over worker's fencing token.
  expect(unit).toMatchObject({ status: 'queued', epoch: 4, lease: null });
  expect((await harness.drain()).at(-1)?.kind).toBe('completed');
  expect(decodeUnit(unitDoc.path, (await unitDoc.get()).data())).toMatchObject({ status: 'done', epoch: 5 });
});

test("a unit created between the fan-out's read and its commit fails the commit's create, and the fan-out decides again", async () => {
  const jobId = await harness.submit('canary', { text });
  await harness.drain(1);
  const unitDoc = db().doc(unitPath(jobId, 'measure', 'p00'));
  const interposed = afterFirstGetAll(db(), unitsOnly, () => unitDoc.create(encodeUnit(leftoverUnit(jobId, 2))));
  const outcomes = await whileInterposed(interposed, () => harness.drain(1));
  expect(interposed.ran()).toBe(true);
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  expect(decodeUnit(unitDoc.path, (await unitDoc.get()).data())).toMatchObject({ status: 'queued', epoch: 2 });
});

test('the sweeper parks a leftover unit between the fan-out\'s read and its commit: the fan-out decides again, the unit is queued under the new fan-out and the job completes', async () => {
  const jobId = await harness.submit('canary', { text });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  const unitDoc = db().doc(unitPath(jobId, 'measure', 'p00'));
  // Its lease has expired: the sweeper's expired-unit-lease rule finds it, and parks it (its fan-out ended).
  await unitDoc.set(encodeUnit(leftoverUnit(jobId, 3, harness.clock.now() - 1_000)));
  let report;
  const interposed = afterFirstGetAll(db(), unitsOnly, async () => {
    report = await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  });
  const outcomes = await whileInterposed(interposed, () => harness.drain(1));
  expect(interposed.ran()).toBe(true);
  expect(report).toMatchObject({ parkedUnits: 1 });
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  const job = await harness.readJob(jobId);
  const unit = decodeUnit(unitDoc.path, (await unitDoc.get()).data());
  // Not the parked record, and not the record as read before the park: the fan-out's own, at the epoch the unit was at.
  expect(unit).toMatchObject({ status: 'queued', epoch: 3, lease: null, fanoutEpoch: job.epoch, lastError: null });
  expect((await harness.drain()).at(-1)?.kind).toBe('completed');
  expect(decodeUnit(unitDoc.path, (await unitDoc.get()).data())).toMatchObject({ status: 'done', epoch: 4 });
});

test('the owner cancels between the fan-out\'s read and its commit: nothing of the fan-out lands, no unit is dispatched', async () => {
  const jobId = await harness.submit('canary', { text });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  const interposed = afterFirstGetAll(db(), unitsOnly, async () => {
    await cancelJob(harness.store, { jobId, owner: 'user-1', reason: 'changed my mind' });
  });
  const outcomes = await whileInterposed(interposed, () => harness.drain(1));
  expect(interposed.ran()).toBe(true);
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['ownership-lost']);
  const job = await harness.readJob(jobId);
  expect(job).toMatchObject({ status: 'cancelled', fanout: null });
  const units = await db().collection(`${JOBS}/${jobId}/units`).get();
  expect(units.docs.map((doc) => doc.id)).toEqual([]);
  expect(harness.queue.tasks).toEqual([]);
});

test('a unit that changes after every read of the fan-out: the start gives up after a bounded number of tries with a CheckpointWriteError, never overwriting it', async () => {
  const jobId = await harness.submit('canary', { text });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  const unitDoc = db().doc(unitPath(jobId, 'measure', 'p00'));
  await unitDoc.set(encodeUnit(leftoverUnit(jobId, 1)));
  let epoch = 1;
  // A (stale) writer that moves the unit on right after each read: every conditioned commit fails.
  const interposed = afterEveryGetAll(db(), unitsOnly, async () => {
    epoch += 1;
    await unitDoc.set(encodeUnit(leftoverUnit(jobId, epoch)));
  });
  const task = harness.queue.tasks.shift();
  let error: unknown;
  try {
    await runStep(harness.deps(), task!.task);
  } catch (caught) {
    error = caught;
  } finally {
    interposed.restore();
  }
  expect(error).toBeInstanceOf(CheckpointWriteError);
  expect(interposed.times()).toBeLessThanOrEqual(8);
  // The last interposed write stands: the fan-out never wrote over it.
  expect(decodeUnit(unitDoc.path, (await unitDoc.get()).data())).toMatchObject({ status: 'running', epoch, fanoutEpoch: 0 });
  const job = await harness.readJob(jobId);
  expect(job.fanout).toBeNull();
});

test('a stale job holder (taken over after it read the units) cannot land its fan-out over the taker\'s: no unit is written back, no epoch is reused', async () => {
  const jobId = await harness.submit('canary', { text });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  const task = harness.queue.tasks.shift();
  expect(task).toBeDefined();
  const inner: string[] = [];
  const interposed = afterFirstGetAll(db(), unitsOnly, async () => {
    // worker-a went silent after its read: worker-b takes the step over, starts its own fan-out, and one of its units runs to the end.
    harness.clock.advance((harness.options.leaseSeconds + harness.options.staleHeartbeatSeconds) * 1000 + 1_000);
    inner.push((await runStep(harness.deps('worker-b'), task!.task)).kind);
    const unitTask = harness.queue.tasks.shift();
    inner.push((await runStep(harness.deps('worker-b'), unitTask!.task)).kind);
  });
  const outer = await whileInterposed(interposed, () => runStep(harness.deps('worker-a'), task!.task));
  expect(interposed.ran()).toBe(true);
  expect(inner).toEqual(['fanned-out', 'unit-done']);
  expect(outer.kind).toBe('ownership-lost');
  const job = await harness.readJob(jobId);
  expect(job.fanout).toMatchObject({ epoch: job.epoch, done: 1, units: 2 });
  const units = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs.map((doc) => decodeUnit(doc.ref.path, doc.data()));
  // The unit worker-b ran is done at epoch 1; the other waits for its task, queued at epoch 0; both in worker-b's fan-out.
  expect(units.map((unit) => ({ status: unit.status, epoch: unit.epoch, fanoutEpoch: unit.fanoutEpoch })).sort((a, b) => a.status.localeCompare(b.status))).toEqual([
    { status: 'done', epoch: 1, fanoutEpoch: job.epoch },
    { status: 'queued', epoch: 0, fanoutEpoch: job.epoch },
  ]);
  // Only worker-b's remaining unit task is queued: worker-a dispatched nothing.
  expect(harness.queue.tasks).toHaveLength(1);
  expect((await harness.drain()).at(-1)?.kind).toBe('completed');
});
