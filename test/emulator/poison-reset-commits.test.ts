/**
 * The first section recorded after a lost worker resets the lost-worker (poison) count on the job
 * or unit record in the same commit: a commit conditioned on the record (a unit's also on its claim
 * slot), not a transaction that locks the record while the section is looked for.
 */
import { z } from 'zod';
import { defineFanOutPhase, definePipeline, pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import { JOBS, sectionKey, sectionPath, unitPath } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { afterFirstGet } from '../support/interpose';
import { testPipeline } from '../support/test-pipeline';

/** Each unit records one section, then finishes with its value. */
const oneSectionUnits = definePipeline<{ units: number }>({
  name: 'one-section-units',
  description: 'Test pipeline: fan-out units of one section each',
  input: z.strictObject({ units: z.number().int().min(1).max(3) }),
  phases: [
    defineFanOutPhase<{ units: number }, { total: number }, { value: number }>({
      name: 'gather',
      state: z.object({ total: z.number() }),
      section: z.object({ value: z.number() }),
      fanOut: {
        units: (context) => Array.from({ length: context.input.units }, (_, index) => `u${index}`),
        unitState: z.object({ value: z.number() }),
        runUnit: async (context) => {
          if (context.sections().length === 0) await context.recordSection('only', { value: 5 });
          return { kind: 'done', state: { value: (context.sections()[0]?.data as { value: number }).value } };
        },
        join: (results) => ({ total: [...results.values()].reduce((sum, result) => sum + result.value, 0) }),
      },
    }),
  ],
  publish: () => ({ outcome: 'complete', title: 'Total', markdown: 'done', missing: [] }),
});

const harness = engineSuite('poison-reset-commits', pipelineRegistry(testPipeline, oneSectionUnits));

const db = () => harness.firestore.db;
const RESET_MESSAGE = /lost-worker count starts again/;
const resetEvents = async (jobId: string): Promise<number> =>
  (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.filter((doc) => doc.get('kind') === 'progress' && RESET_MESSAGE.test(String(doc.get('message')))).length;

test("a job's first section after lost workers resets their count in the job's conditioned commit: no transaction", async () => {
  const jobId = await harness.submit('two-phase', { sections: 2 });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  // Two workers were lost on this job without progress (what a stale reclaim counts).
  await db().doc(`${JOBS}/${jobId}`).update({ staleReclaims: 2 });
  const transactions = jest.spyOn(db(), 'runTransaction');
  let kinds;
  try {
    kinds = (await harness.drain(1)).map((outcome) => outcome.kind);
    expect(transactions).not.toHaveBeenCalled();
  } finally {
    transactions.mockRestore();
  }
  expect(kinds).toEqual(['handed-off']);
  expect(await resetEvents(jobId)).toBe(1);
  expect((await db().collection(`${JOBS}/${jobId}/sections`).get()).size).toBe(2);
});

test("a unit's first section after lost workers resets the unit's count in its conditioned commit: no transaction", async () => {
  const jobId = await harness.submit('one-section-units', { units: 1 });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  const unitDoc = db().doc(unitPath(jobId, 'gather', 'u0'));
  await unitDoc.update({ staleReclaims: 2 });
  const [unitTask] = harness.queue.drain();
  const transactions = jest.spyOn(db(), 'runTransaction');
  let outcome;
  try {
    outcome = await runStep(harness.deps('unit-worker'), unitTask!.task);
    expect(transactions).not.toHaveBeenCalled();
  } finally {
    transactions.mockRestore();
  }
  expect(outcome.kind).toBe('unit-done');
  expect((await unitDoc.get()).get('staleReclaims')).toBe(0);
  expect(await resetEvents(jobId)).toBe(1);
});

test("a unit's section that appears between the look for it and the commit is not written twice: the first write stands and the unit goes on", async () => {
  const jobId = await harness.submit('one-section-units', { units: 1 });
  await harness.drain(1);
  await db().doc(unitPath(jobId, 'gather', 'u0')).update({ staleReclaims: 1 });
  const [unitTask] = harness.queue.drain();
  const section = db().doc(sectionPath(jobId, sectionKey('gather', 'u0', 'only')));
  const interposed = afterFirstGet(db(), section.path, async () => {
    await section.create({ id: 'only', phase: 'gather', unit: 'u0', data: { value: 7 }, epoch: 1 });
  });
  let outcome;
  try {
    outcome = await runStep(harness.deps('unit-worker'), unitTask!.task);
  } finally {
    interposed.restore();
  }
  expect(interposed.ran()).toBe(true);
  expect(outcome.kind).toBe('unit-done');
  expect((await section.get()).get('data')).toEqual({ value: 7 });
});

test("a job's section that appears between the look for it and the commit: the commit is decided again and the first write stands", async () => {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  await harness.drain(1);
  await db().doc(`${JOBS}/${jobId}`).update({ staleReclaims: 1 });
  const section = db().doc(sectionPath(jobId, sectionKey('second', null, 's0')));
  const interposed = afterFirstGet(db(), section.path, async () => {
    await section.create({ id: 's0', phase: 'second', unit: null, data: { value: 70 }, epoch: 2 });
  });
  let outcomes;
  try {
    outcomes = await harness.drain();
  } finally {
    interposed.restore();
  }
  expect(interposed.ran()).toBe(true);
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'completed']);
  expect((await section.get()).get('data')).toEqual({ value: 70 });
});
