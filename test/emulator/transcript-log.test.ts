/**
 * Transcripts as append-only logs, through the real step runner on the Firestore emulator: a
 * 200-turn section saved turn by turn, then resumed by the next step, comes back whole; each save
 * is one new document holding only its own turn; a corrupt save is refused, not trusted; and a
 * transcript document from before the log is where the log resumes.
 */
import { pipelineRegistry, type PhaseOutcome, type StepContext } from '../../functions/src/core/pipeline';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { behaviour, testPipeline, type TestInput } from '../support/test-pipeline';

const harness = engineSuite('transcript-log', pipelineRegistry(testPipeline));

const db = () => harness.firestore.db;
const TURNS = 200;
const turn = (index: number) => ({ role: index % 2 === 0 ? 'assistant' : 'tool', content: `turn ${index}: ${'x'.repeat(1_000)}` });
const transcriptOf = (turns: number) => ({ generation: 0, attempts: { warm: 0, cold: 0 }, messages: Array.from({ length: turns }, (_, index) => turn(index)) });

async function transcriptDocuments(jobId: string) {
  return (await db().collection(`${JOBS}/${jobId}/transcripts`).get()).docs;
}

test('a 200-turn section saved turn by turn: one document per save holding only its turn; the next step loads all 200 turns', async () => {
  const loadedBySteps: unknown[] = [];
  behaviour.second = async (context: StepContext<TestInput>): Promise<PhaseOutcome<{ total: number }>> => {
    const loaded = await context.loadTranscript('long');
    loadedBySteps.push(loaded);
    if (loaded === null) {
      for (let turns = 1; turns <= TURNS; turns += 1) await context.saveTranscript('long', transcriptOf(turns));
      return { kind: 'yield' };
    }
    await context.recordSection('long', { value: 1 });
    return { kind: 'done', state: { total: 1 } };
  };
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const outcomes = await harness.drain(5);

  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'handed-off', 'handed-off', 'completed']);
  expect(loadedBySteps).toEqual([null, transcriptOf(TURNS)]);
  const documents = await transcriptDocuments(jobId);
  expect(documents).toHaveLength(TURNS);
  // Each save holds its own turn only: every turn's bytes are written once.
  for (const document of documents) expect(document.get('messages')).toHaveLength(1);
  const written = documents.reduce((sum, document) => sum + JSON.stringify(document.data()).length, 0);
  expect(written).toBeLessThan(TURNS * 1_300);
});

test('a save whose document was tampered with (keeps more than the log holds) loads as unreadable, and a clean save after it reads again', async () => {
  const loadedBySteps: unknown[] = [];
  let step = 0;
  behaviour.second = async (context: StepContext<TestInput>): Promise<PhaseOutcome<{ total: number }>> => {
    step += 1;
    loadedBySteps.push(await context.loadTranscript('t'));
    if (step === 1) {
      await context.saveTranscript('t', transcriptOf(1));
      await context.saveTranscript('t', transcriptOf(2));
      return { kind: 'yield' };
    }
    if (step === 2) {
      // The pipeline refuses what it cannot read and starts again: a save that keeps nothing.
      await context.saveTranscript('t', { generation: 1, attempts: { warm: 0, cold: 0 }, messages: [turn(0)] });
      return { kind: 'yield' };
    }
    await context.recordSection('t', { value: 1 });
    return { kind: 'done', state: { total: 1 } };
  };
  const jobId = await harness.submit('two-phase', { sections: 1 });
  await harness.drain(1); // phase one
  await harness.drain(1); // step 1 of phase two: two saves, then it yields
  const [, second] = (await transcriptDocuments(jobId)).sort((a, b) => a.id.localeCompare(b.id));
  await second!.ref.update({ keep: 7 });
  await harness.drain();

  expect(loadedBySteps[0]).toBeNull();
  expect(loadedBySteps[1]).toEqual({ unreadableTranscript: 'save 1 is malformed or keeps 7 of 1 messages' });
  expect(loadedBySteps[2]).toEqual({ generation: 1, attempts: { warm: 0, cold: 0 }, messages: [turn(0)] });
});

test('a whole-transcript document from before the log is loaded, and the next save appends to it', async () => {
  const loadedBySteps: unknown[] = [];
  behaviour.second = async (context: StepContext<TestInput>): Promise<PhaseOutcome<{ total: number }>> => {
    const loaded = await context.loadTranscript('old');
    loadedBySteps.push(loaded);
    if (loadedBySteps.length === 1) {
      await context.saveTranscript('old', transcriptOf(3));
      return { kind: 'yield' };
    }
    await context.recordSection('old', { value: 1 });
    return { kind: 'done', state: { total: 1 } };
  };
  const jobId = await harness.submit('two-phase', { sections: 1 });
  await harness.drain(1); // phase one
  // As the engine wrote transcripts before the log: one document, the whole transcript in it.
  await db().doc(`${JOBS}/${jobId}/transcripts/second~-~old`).set({ phase: 'second', unit: null, id: 'old', transcript: transcriptOf(2), epoch: 1, savedAtMs: 0 });
  await harness.drain();

  expect(loadedBySteps).toEqual([transcriptOf(2), transcriptOf(3)]);
  const save = (await transcriptDocuments(jobId)).find((document) => document.id !== 'second~-~old');
  expect(save?.data()).toMatchObject({ save: 1, keep: 2, messages: [turn(2)] });
});
