/**
 * A unit's finish is a read and a batch conditioned on the job: when every unit of a fan-out
 * finishes at once, each round of commits lands one of them, and the others read again (after a
 * short random pause) until theirs lands. None gives up, and the fan-out joins once.
 */
import { z } from 'zod';
import { defineFanOutPhase, definePipeline, pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';

const UNITS = 16;
const instant = definePipeline<{ units: number }>({
  name: 'instant-units',
  description: 'Test pipeline: units that finish at once',
  input: z.strictObject({ units: z.number().int().min(1).max(50) }),
  phases: [
    defineFanOutPhase<{ units: number }, { total: number }, { one: number }>({
      name: 'count',
      state: z.object({ total: z.number() }),
      section: z.object({ value: z.number() }),
      fanOut: {
        units: (context) => Array.from({ length: context.input.units }, (_, index) => `u${String(index).padStart(2, '0')}`),
        unitState: z.object({ one: z.number() }),
        runUnit: () => Promise.resolve({ kind: 'done', state: { one: 1 } }),
        join: (results) => ({ total: [...results.values()].reduce((sum, result) => sum + result.one, 0) }),
      },
    }),
  ],
  publish: (context) => ({ outcome: 'complete', title: 'Sum', markdown: JSON.stringify(context.sections()), missing: [] }),
});

const harness = engineSuite('fanout-many-finishers', pipelineRegistry(instant));

test(`${UNITS} units finishing at once: every finish lands and the fan-out joins once`, async () => {
  const jobId = await harness.submit('instant-units', { units: UNITS });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  const tasks = harness.queue.drain();
  expect(tasks).toHaveLength(UNITS);
  const outcomes = await Promise.all(
    tasks.map((recorded, index) =>
      runStep(harness.deps(`w${index}`), recorded.task).then(
        (outcome) => outcome.kind,
        (error: unknown) => `threw ${(error as Error).constructor.name}: ${(error as Error).message.slice(0, 120)}`,
      ),
    ),
  );
  const units = (await harness.firestore.db.collection(`${JOBS}/${jobId}/units`).get()).docs.map((doc) => doc.get('status') as string);
  const joined = (await harness.firestore.db.collection(`${JOBS}/${jobId}/events`).where('kind', '==', 'joined').get()).size;
  expect(units).toEqual(Array.from({ length: UNITS }, () => 'done'));
  expect(outcomes.every((kind) => kind === 'unit-done')).toBe(true);
  expect(joined).toBe(1);
});
