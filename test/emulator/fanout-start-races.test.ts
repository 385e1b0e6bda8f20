/**
 * The fan-out start is a plain read of its units and one batch conditioned on the
 * job (and each unit on the version read). These tests interpose other actors between that read
 * and that commit: the sweeper, the owner's cancel, and a writer that keeps changing a unit.
 */
import type { DocumentReference, DocumentSnapshot, ReadOptions } from 'firebase-admin/firestore';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import type { UnitRecord } from '../../functions/src/core/job';
import { CheckpointWriteError } from '../../functions/src/core/errors';
import { canaryPipeline } from '../../functions/src/pipelines/canary';
import { sweep } from '../../functions/src/engine/sweeper';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import { decodeJob, decodeUnit, encodeUnit } from '../../functions/src/store/codec';
import { JOBS, unitPath } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';

const harness = engineSuite('fanout-start-races', pipelineRegistry(canaryPipeline));

const db = () => harness.firestore.db;
const text = 'One paragraph here.\n\nAnd a second one.';

/** A unit of the canary's fan-out phase as an earlier fan-out (epoch 0) left it: held at `epoch`, lease expiring at `expiresAtMs`. */
function leftoverUnit(jobId: string, epoch: number, expiresAtMs: number): UnitRecord {
  const nowMs = harness.clock.now();
  return {
    jobId,
    unit: 'p00',
    phase: 'measure',
    fanoutEpoch: 0,
    status: 'running',
    epoch,
    lease: { epoch, worker: 'earlier-worker', expiresAtMs },
    step: 0,
    dispatch: 0,
    attempts: 0,
    staleReclaims: 0,
    nextRunAtMs: nowMs,
    progress: {},
    cost: {},
    costInJob: {},
    claimTally: null,
    result: null,
    lastError: null,
    updatedAtMs: nowMs,
  };
}

const unitsOnly = (paths: readonly string[]) => paths.length > 0 && paths.every((path) => path.includes('/units/'));

/** Runs `during` after every `getAll` whose references all pass `matches` (at most `times` times). */
function afterReads(matches: (paths: readonly string[]) => boolean, during: () => Promise<void>, times = 1): { restore: () => void; runs: () => number } {
  const getAll = db().getAll.bind(db());
  let runs = 0;
  const spy = jest.spyOn(db(), 'getAll').mockImplementation(async (...refs: (DocumentReference | ReadOptions)[]): Promise<DocumentSnapshot[]> => {
    const snapshots = await getAll(...refs);
    const paths = refs.map((ref) => ('path' in ref ? ref.path : ''));
    if (runs < times && matches(paths)) {
      runs += 1;
      await during();
    }
    return snapshots;
  });
  return { restore: () => spy.mockRestore(), runs: () => runs };
}

test('the sweeper parks a leftover unit between the fan-out\'s read and its commit: the fan-out decides again, the unit is queued under the new fan-out and the job completes', async () => {
  const jobId = await harness.submit('canary', { text });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  const unitDoc = db().doc(unitPath(jobId, 'measure', 'p00'));
  // Its lease has expired: the sweeper's expired-unit-lease rule finds it, and parks it (its fan-out ended).
  await unitDoc.set(encodeUnit(leftoverUnit(jobId, 3, harness.clock.now() - 1_000)));
  let report;
  const interposed = afterReads(unitsOnly, async () => {
    report = await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  });
  let outcomes;
  try {
    outcomes = await harness.drain(1);
  } finally {
    interposed.restore();
  }
  expect(interposed.runs()).toBe(1);
  expect(report).toMatchObject({ parkedUnits: 1 });
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  const unit = decodeUnit(unitDoc.path, (await unitDoc.get()).data());
  // Not the parked record, and not the record as read before the park: the fan-out's own, at the epoch the unit was at.
  expect(unit).toMatchObject({ status: 'queued', epoch: 3, lease: null, fanoutEpoch: job.epoch, lastError: null });
  expect((await harness.drain()).at(-1)?.kind).toBe('completed');
  expect(decodeUnit(unitDoc.path, (await unitDoc.get()).data())).toMatchObject({ status: 'done', epoch: 4 });
});

test('the owner cancels between the fan-out\'s read and its commit: nothing of the fan-out lands, no unit is dispatched', async () => {
  const jobId = await harness.submit('canary', { text });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  const interposed = afterReads(unitsOnly, async () => {
    await cancelJob(harness.store, { jobId, owner: 'user-1', reason: 'changed my mind' });
  });
  let outcomes;
  try {
    outcomes = await harness.drain(1);
  } finally {
    interposed.restore();
  }
  expect(interposed.runs()).toBe(1);
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['ownership-lost']);
  const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  expect(job).toMatchObject({ status: 'cancelled', fanout: null });
  const units = await db().collection(`${JOBS}/${jobId}/units`).get();
  expect(units.docs.map((doc) => doc.id)).toEqual([]);
  expect(harness.queue.tasks).toEqual([]);
});

test('a unit that changes after every read of the fan-out: the start gives up after a bounded number of tries with a CheckpointWriteError, never overwriting it', async () => {
  const jobId = await harness.submit('canary', { text });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  const unitDoc = db().doc(unitPath(jobId, 'measure', 'p00'));
  await unitDoc.set(encodeUnit(leftoverUnit(jobId, 1, harness.clock.now() + 60_000)));
  let epoch = 1;
  // A (stale) writer that moves the unit on right after each read: every conditioned commit fails.
  const interposed = afterReads(
    unitsOnly,
    async () => {
      epoch += 1;
      await unitDoc.set(encodeUnit(leftoverUnit(jobId, epoch, harness.clock.now() + 60_000)));
    },
    1_000,
  );
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
  expect(interposed.runs()).toBeLessThanOrEqual(8);
  // The last interposed write stands: the fan-out never wrote over it.
  expect(decodeUnit(unitDoc.path, (await unitDoc.get()).data())).toMatchObject({ status: 'running', epoch, fanoutEpoch: 0 });
  const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  expect(job.fanout).toBeNull();
});

test('a stale job holder (taken over after it read the units) cannot land its fan-out over the taker\'s: no unit is written back, no epoch is reused', async () => {
  const jobId = await harness.submit('canary', { text });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  const task = harness.queue.tasks.shift();
  expect(task).toBeDefined();
  const inner: string[] = [];
  const interposed = afterReads(unitsOnly, async () => {
    // worker-a went silent after its read: worker-b takes the step over, starts its own fan-out, and one of its units runs to the end.
    harness.clock.advance((harness.options.leaseSeconds + harness.options.staleHeartbeatSeconds) * 1000 + 1_000);
    inner.push((await runStep(harness.deps('worker-b'), task!.task)).kind);
    const unitTask = harness.queue.tasks.shift();
    inner.push((await runStep(harness.deps('worker-b'), unitTask!.task)).kind);
  });
  let outer;
  try {
    outer = await runStep(harness.deps('worker-a'), task!.task);
  } finally {
    interposed.restore();
  }
  expect(interposed.runs()).toBe(1);
  expect(inner).toEqual(['fanned-out', 'unit-done']);
  expect(outer.kind).toBe('ownership-lost');
  const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
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
