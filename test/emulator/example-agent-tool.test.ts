/**
 * examples/agent-tool runs as its README says: the store assistant on the real engine and the
 * Firestore emulator, its model the AI SDK's MockLanguageModelV3 scripted to call the custom tool
 * (first with arguments the tool's zod schema refuses, then properly) and then answer from it.
 */
import type { LanguageModelV3Prompt } from '@ai-sdk/provider';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { createStoreAssistant } from '../../examples/agent-tool/pipeline';
import { engineHarness } from '../support/engine';
import { scriptedModel, shownResults, type ScriptedTurn } from '../support/scripted-model';

function decide(prompt: LanguageModelV3Prompt): ScriptedTurn {
  const shown = shownResults(prompt);
  if (shown.length === 0) return { toolCalls: [{ id: 'call-1', name: 'opening_hours', input: { town: 'Lisbon' } }] };
  if (shown.length === 1) return { toolCalls: [{ id: 'call-2', name: 'opening_hours', input: { city: 'Lisbon' } }] };
  return { text: `Our Lisbon store is open ${shown[1]?.text ?? '?'}.` };
}

const model = scriptedModel(decide);
const harness = engineHarness('example-agent-tool', pipelineRegistry(createStoreAssistant(model)));
beforeEach(() => harness.firestore.reset());
afterAll(() => harness.firestore.close());

test('the example agent calls its tool through the AI SDK adapter, reads the refusal of bad arguments, and answers from the result', async () => {
  const jobId = await harness.submit('store-assistant', { question: 'When is the Lisbon store open on Saturday?' });
  await harness.drain();

  const job = decodeJob(jobId, (await harness.firestore.db.doc(`${JOBS}/${jobId}`).get()).data());
  expect(job).toMatchObject({ status: 'completed', outcome: 'complete' });
  expect(model.doStreamCalls).toHaveLength(3);
  // Offered with its zod schema as JSON Schema.
  const [offered] = model.doStreamCalls[0]?.tools ?? [];
  expect(offered).toMatchObject({ type: 'function', name: 'opening_hours', inputSchema: { required: ['city'] } });
  const [refusal, hours] = shownResults(model.doStreamCalls[2]?.prompt ?? []);
  expect(refusal?.text).toContain('Invalid arguments for opening_hours');
  expect(hours?.text).toBe('Mon-Sat 09:00-20:00, closed on Sunday');
  const markdown = (await harness.firestore.db.doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown') as string;
  expect(markdown).toBe('Our Lisbon store is open Mon-Sat 09:00-20:00, closed on Sunday.');
});
