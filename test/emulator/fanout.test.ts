import { z } from 'zod';
import { defineFanOutPhase, definePipeline, pipelineRegistry } from '../../functions/src/core/pipeline';
import type { DocumentReference, DocumentSnapshot, ReadOptions } from 'firebase-admin/firestore';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import { canaryPipeline } from '../../functions/src/pipelines/canary';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';

/** Units that each record three sections, one per step: every unit yields twice before it finishes. */
const unitRuns = new Map<string, number>();
const steppedPipeline = definePipeline<{ units: number }>({
  name: 'stepped-units',
  description: 'Test pipeline: fan-out units that yield between sections',
  input: z.strictObject({ units: z.number().int().min(1).max(5) }),
  phases: [
    defineFanOutPhase<{ units: number }, { total: number }, { sum: number }>({
      name: 'count',
      state: z.object({ total: z.number() }),
      section: z.object({ value: z.number() }),
      fanOut: {
        units: (context) => Array.from({ length: context.input.units }, (_, index) => `u${index}`),
        unitState: z.object({ sum: z.number() }),
        runUnit: async (context, unit) => {
          const done = context.sections().length;
          if (done === 3) return { kind: 'done', state: { sum: context.sections().reduce((sum, section) => sum + (section.data as { value: number }).value, 0) } };
          unitRuns.set(`${unit}/${done}`, (unitRuns.get(`${unit}/${done}`) ?? 0) + 1);
          await context.recordSection(`n${done}`, { value: done + 1 });
          return { kind: 'yield' };
        },
        join: (results) => ({ total: [...results.values()].reduce((sum, result) => sum + result.sum, 0) }),
      },
    }),
  ],
  publish: (context) => ({ outcome: 'complete', title: 'Sum', markdown: JSON.stringify(context.sections()), missing: [] }),
});

const harness = engineSuite('fanout', pipelineRegistry(canaryPipeline, steppedPipeline));

const text = 'The first paragraph. It has two sentences.\n\nA second one, with extraordinarily long words.\n\nThird!';
const db = () => harness.firestore.db;
const kinds = async (jobId: string) => (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.map((doc) => doc.get('kind') as string);

test('a fan-out runs one task per unit, joins once, and the job completes with every unit in the result', async () => {
  const jobId = await harness.submit('canary', { text });
  const outcomes = await harness.drain();

  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'fanned-out', 'unit-done', 'unit-done', 'unit-done', 'handed-off', 'completed']);
  const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  expect(job).toMatchObject({ status: 'completed', fanout: null, progress: { paragraphs: 3, sectionsDone: 3, sectionsTotal: 3 } });
  const units = await db().collection(`${JOBS}/${jobId}/units`).get();
  expect(units.docs.map((doc) => [doc.id, doc.get('status') as string])).toEqual([['measure~p00', 'done'], ['measure~p01', 'done'], ['measure~p02', 'done']]);
  const markdown = (await db().doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown') as string;
  expect(markdown).toContain('3 paragraphs, 15 words.');
  expect(markdown).toContain('Paragraph 2: 7 words, 1 sentences, longest word "extraordinarily"');
  expect((await kinds(jobId)).filter((kind) => kind === 'joined')).toHaveLength(1);
});

test('units finishing at the same moment join exactly once and hand off exactly one next step', async () => {
  const jobId = await harness.submit('canary', { text });
  await harness.drain(2); // split, then the fan-out
  const unitTasks = harness.queue.drain();
  expect(unitTasks.map((recorded) => recorded.task.unit)).toEqual(['p00', 'p01', 'p02']);

  const outcomes = await Promise.all(unitTasks.map((recorded, index) => runStep(harness.deps(`unit-worker-${index}`), recorded.task)));
  expect(outcomes.filter((outcome) => outcome.kind === 'unit-done' && outcome.joined)).toHaveLength(1);
  expect(outcomes.filter((outcome) => outcome.kind === 'unit-done')).toHaveLength(3);
  expect(harness.queue.tasks).toHaveLength(1);
  expect((await kinds(jobId)).filter((kind) => kind === 'joined')).toHaveLength(1);

  // A unit task delivered again after the join finds nothing to do.
  expect((await runStep(harness.deps(), unitTasks[0]!.task)).kind).toBe('not-claimable');
  await harness.drain();
  expect((await db().doc(`${JOBS}/${jobId}`).get()).get('status')).toBe('completed');
});

test('units claiming and finishing at once hold no locks: no transaction, and the fan-out still joins once', async () => {
  // A finish in a transaction that reads the job locks it; on the emulator the unit that lost the race waited about three seconds.
  const jobId = await harness.submit('canary', { text });
  await harness.drain(2);
  const unitTasks = harness.queue.drain();
  const transactions = jest.spyOn(db(), 'runTransaction');
  try {
    const outcomes = await Promise.all(unitTasks.map((recorded, index) => runStep(harness.deps(`racing-worker-${index}`), recorded.task)));
    expect(outcomes.map((outcome) => outcome.kind)).toEqual(['unit-done', 'unit-done', 'unit-done']);
    // The claims, the finishes and the join are conditioned commits: no transaction locks the job.
    expect(transactions).not.toHaveBeenCalled();
  } finally {
    transactions.mockRestore();
  }
  const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  expect(job.fanout).toBeNull();
  expect((await kinds(jobId)).filter((kind) => kind === 'unit-done')).toHaveLength(3);
  expect((await kinds(jobId)).filter((kind) => kind === 'joined')).toHaveLength(1);
  await harness.drain();
  expect((await db().doc(`${JOBS}/${jobId}`).get()).get('status')).toBe('completed');
});

test('a unit whose fan-out ends between its read and its commit lands nothing: its claim slot fences a commit that does not write the job', async () => {
  const jobId = await harness.submit('stepped-units', { units: 1 });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  const [unitTask] = harness.queue.drain();
  if (!unitTask) throw new Error('no unit task');
  const owner = (await db().doc(`${JOBS}/${jobId}`).get()).get('owner') as string;
  const getAll = db().getAll.bind(db());
  let cancelled = false;
  let unitReads = 0;
  // The claim and then the yield each read the job, the unit and its claim slot; the owner cancels right after the yield's read.
  const reads = jest.spyOn(db(), 'getAll').mockImplementation(async (...refs: (DocumentReference | ReadOptions)[]): Promise<DocumentSnapshot[]> => {
    const snapshots = await getAll(...refs);
    const paths = refs.map((ref) => ('path' in ref ? ref.path : ''));
    const slotRead = paths.length === 3 && paths[0] === `${JOBS}/${jobId}` && paths[1]?.includes('/units/') === true && paths[2]?.includes('/claims/') === true;
    if (slotRead) unitReads += 1;
    if (!cancelled && slotRead && unitReads === 2) {
      cancelled = true;
      await cancelJob(harness.store, { jobId, owner, reason: 'cancelled while its unit commits' });
    }
    return snapshots;
  });
  let outcome;
  try {
    outcome = await runStep(harness.deps('unit-worker'), unitTask.task);
  } finally {
    reads.mockRestore();
    // The stepped pipeline counts its unit runs for the test below.
    unitRuns.clear();
  }
  expect(cancelled).toBe(true);
  expect(outcome.kind).toBe('ownership-lost');
  expect((await db().doc(`${JOBS}/${jobId}`).get()).get('status')).toBe('cancelled');
  const [unit] = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs;
  // The yield would have queued the unit again at its next step and sent its task.
  expect(unit?.get('status')).toBe('running');
  expect(harness.queue.tasks).toEqual([]);
});

test('the canary rejects input that is only whitespace before any job exists', () => {
  expect(canaryPipeline.input.safeParse({ text: '  \n ' }).success).toBe(false);
  expect(canaryPipeline.input.safeParse({ text: 'fine' }).success).toBe(true);
});

test('a unit that yields is continued by a new task (a new task ID per unit step) and each of its sections runs once', async () => {
  const jobId = await harness.submit('stepped-units', { units: 2 });
  const outcomes = await harness.drain();
  expect(outcomes.filter((outcome) => outcome.kind === 'unit-yielded')).toHaveLength(6);
  expect(outcomes.at(-1)?.kind).toBe('completed');
  expect([...unitRuns.values()].every((runs) => runs === 1)).toBe(true);
  expect(unitRuns.size).toBe(6);
  expect((await db().doc(`${JOBS}/${jobId}/checkpoints/count`).get()).get('state')).toEqual({ total: 12 });
  expect(harness.queue.duplicates).toEqual([]);
});
