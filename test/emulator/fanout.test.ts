import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/runner';
import { canaryPipeline } from '../../functions/src/pipelines/canary';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { engineHarness, type EngineHarness } from '../support/engine';

let harness: EngineHarness;
beforeAll(() => {
  harness = engineHarness('fanout', pipelineRegistry(canaryPipeline));
});
beforeEach(async () => {
  harness.queue.drain();
  await harness.firestore.reset();
});
afterAll(() => harness.firestore.close());

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
  expect(units.docs.map((doc) => [doc.id, doc.get('status') as string])).toEqual([['p00', 'done'], ['p01', 'done'], ['p02', 'done']]);
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

test('the canary rejects input that is only whitespace before any job exists', () => {
  expect(canaryPipeline.input.safeParse({ text: '  \n ' }).success).toBe(false);
  expect(canaryPipeline.input.safeParse({ text: 'fine' }).success).toBe(true);
});
