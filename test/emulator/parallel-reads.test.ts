/**
 * Reads that used to run one after the other run side by side. An error
 * path changes when the first read used to decide before the second was made:
 *
 *   - a unit step: an unreadable checkpoint settled the unit before its sections were read; now
 *     the sections read runs anyway. A failing sections read must not change the outcome (nor be
 *     an unhandled rejection).
 *   - publication: an unresolved effect failed the job (UnresolvedEffectsError, terminal) before the
 *     outbox was read; now a failing outbox read beside it wins over that decision.
 */
import type { DocumentReference, DocumentSnapshot, Query, QuerySnapshot } from 'firebase-admin/firestore';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { decodeJob } from '../../functions/src/store/codec';
import { checkpointPath, JOBS, jobPath } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { heldUnitsPipeline } from '../support/held-units';
import { testPipeline } from '../support/test-pipeline';

const { pipeline: units, turns } = heldUnitsPipeline('r5-side-units');

const harness = engineSuite('parallel-reads', pipelineRegistry(testPipeline, units), {
  beforeEach: () => {
    turns.reset();
  },
  afterEach: () => jest.restoreAllMocks(),
});

const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(jobPath(jobId)).get()).data());
const injected = () => Object.assign(new Error('7 PERMISSION_DENIED: injected read failure'), { code: 7 });

function queryTarget(query: Query): string {
  const options = (query as unknown as { _queryOptions: { parentPath: { relativeName: string }; collectionId: string } })._queryOptions;
  return `${options.parentPath.relativeName}/${options.collectionId}`;
}

test('a unit whose stored checkpoint is unreadable (a newer version wrote it) is settled with that reason even when its sections read fails; no unhandled rejection', async () => {
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);
  process.on('unhandledRejection', onUnhandled);
  try {
    const jobId = await harness.submit('r5-side-units', { units: 1 });
    expect((await harness.drain(1))[0]?.kind).toBe('fanned-out');
    const [task] = harness.queue.drain();
    // A worker of version 2 of the phase checkpointed it meanwhile (a rolling deploy): this worker must not read it.
    await db().doc(checkpointPath(jobId, 'experts')).set({ phase: 'experts', state: { total: 1 }, epoch: 1, recordedAtMs: harness.clock.now(), version: 2 });
    const queryPrototype = Object.getPrototypeOf(db().collection('x').where('a', '==', 1)) as { get: (this: Query) => Promise<QuerySnapshot> };
    const get = queryPrototype.get;
    let sectionReads = 0;
    jest.spyOn(queryPrototype, 'get').mockImplementation(async function (this: Query) {
      if (queryTarget(this) === `${JOBS}/${jobId}/sections`) {
        sectionReads += 1;
        await new Promise((resolve) => setTimeout(resolve, 50));
        throw injected();
      }
      return get.call(this);
    });
    const outcome: StepOutcome = await runStep(harness.deps('unit-worker'), task!.task);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(outcome).toMatchObject({ kind: 'requeued' });
    const unitDoc = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs[0];
    expect(unitDoc?.get('lastError.message')).toMatch(/written by its version 2, newer than this worker's version 1/);
    expect(sectionReads).toBeLessThanOrEqual(1);
    expect(unhandled).toEqual([]);
  } finally {
    process.off('unhandledRejection', onUnhandled);
  }
});

test('publication with an unresolved effect fails the job with UnresolvedEffectsError, whatever the outbox read beside it does', async () => {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  // Both phases checkpointed; the next step publishes.
  expect((await harness.drain(2)).map((outcome) => outcome.kind)).toEqual(['handed-off', 'handed-off']);
  await db().doc(`${JOBS}/${jobId}/effects/notify-1`).set({ state: 'unknown', key: 'notify-1' });
  const outbox = `${JOBS}/${jobId}/results/final`;
  const prototype = Object.getPrototypeOf(db().doc(outbox)) as { get: (this: DocumentReference) => Promise<DocumentSnapshot> };
  const get = prototype.get;
  jest.spyOn(prototype, 'get').mockImplementation(async function (this: DocumentReference) {
    if (this.path === outbox) throw injected();
    return get.call(this);
  });
  const [task] = harness.queue.drain();
  let outcome: StepOutcome | { kind: 'threw'; message: string };
  try {
    outcome = await runStep(harness.deps('publisher'), task!.task);
  } catch (error) {
    outcome = { kind: 'threw', message: error instanceof Error ? error.message : String(error) };
  }
  // The ledger read beside the failed outbox read may still be in flight: let it land before the client closes.
  await new Promise((resolve) => setTimeout(resolve, 1_000));
  expect(outcome).toMatchObject({ kind: 'failed' });
  const job = await readJob(jobId);
  expect(job.status).toBe('failed');
  expect(job.lastError?.message).toMatch(/Cannot complete while effects are unresolved .*notify-1/);
});
