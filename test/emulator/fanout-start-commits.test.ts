/**
 * A fan-out's start and a job's publication are commits conditioned on the job, not transactions:
 * nothing is locked while they read. What they read besides the job is fenced too: a unit that
 * changes after the fan-out read it, or an answer that appears after the publication read the
 * outbox, fails the commit, which is decided again from what is there now.
 */
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import type { UnitRecord } from '../../functions/src/core/job';
import { canaryPipeline } from '../../functions/src/pipelines/canary';
import { decodeUnit, encodeUnit } from '../../functions/src/store/codec';
import { JOBS, resultPath, unitPath } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { afterFirstGet, afterFirstGetAll } from '../support/interpose';

const harness = engineSuite('fanout-start-commits', pipelineRegistry(canaryPipeline));

const db = () => harness.firestore.db;
const text = 'One paragraph here.\n\nAnd a second one.';

/** A unit of the canary's fan-out phase as an earlier fan-out of it left it: still held, at `epoch`. */
function leftoverUnit(jobId: string, epoch: number): UnitRecord {
  const nowMs = harness.clock.now();
  return {
    jobId,
    unit: 'p00',
    phase: 'measure',
    fanoutEpoch: 0,
    status: 'running',
    epoch,
    lease: { epoch, worker: 'earlier-worker', expiresAtMs: nowMs + 60_000 },
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
  const interposed = afterFirstGetAll(
    db(),
    (paths) => paths.length > 0 && paths.every((path) => path.includes('/units/')),
    () => unitDoc.set(encodeUnit(leftoverUnit(jobId, 4))).then(() => undefined),
  );
  let outcomes;
  try {
    outcomes = await harness.drain(1);
  } finally {
    interposed.restore();
  }
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
  const interposed = afterFirstGetAll(
    db(),
    (paths) => paths.length > 0 && paths.every((path) => path.includes('/units/')),
    () => unitDoc.create(encodeUnit(leftoverUnit(jobId, 2))).then(() => undefined),
  );
  let outcomes;
  try {
    outcomes = await harness.drain(1);
  } finally {
    interposed.restore();
  }
  expect(interposed.ran()).toBe(true);
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  expect(decodeUnit(unitDoc.path, (await unitDoc.get()).data())).toMatchObject({ status: 'queued', epoch: 2 });
});

test('an answer that appears between the publication\'s read of the outbox and its commit is kept, not published twice', async () => {
  const jobId = await harness.submit('canary', { text });
  const outcomes = await harness.drain(4); // split, fan-out, both units
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'fanned-out', 'unit-done', 'unit-done']);
  const outbox = db().doc(resultPath(jobId));
  const interposed = afterFirstGet(db(), outbox.path, () => outbox.create({ jobId, markdown: 'published by an earlier holder', outcome: 'complete' }));
  let last;
  try {
    last = await harness.drain();
  } finally {
    interposed.restore();
  }
  expect(interposed.ran()).toBe(true);
  expect(last.at(-1)?.kind).toBe('completed');
  expect((await outbox.get()).get('markdown')).toBe('published by an earlier holder');
  expect((await db().doc(`${JOBS}/${jobId}`).get()).get('status')).toBe('completed');
});
