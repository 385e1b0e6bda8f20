/**
 * The section runner saves tool results in the background: saves never overlap, a section never
 * settles with a save in flight, a failed save is never swallowed (out of time, a spend refusal,
 * an abort), and no rejection goes unhandled.
 */
import type { ChatRequest, ChatResponse, ModelProvider, ToolCall } from '../../functions/src/agent/provider';
import { runSection, type SectionDeps, type SectionSpec, type StoredTranscript, type TranscriptPort } from '../../functions/src/agent/section-runner';
import type { Toolbox, ToolResult } from '../../functions/src/agent/tools';
import { SpendLimitReachedError } from '../../functions/src/core/errors';
import { unhandledRejections } from '../support/failures';

const spec: SectionSpec = { sectionId: 's', promptId: 'p', system: 'sys', prompt: 'write', coldContext: '', maxToolRounds: 4 };
const call = (id: string): ToolCall => ({ id, name: 'search', arguments: '{}' });
const toolTurn = (...ids: string[]): ChatResponse => ({ message: { role: 'assistant', content: null, toolCalls: ids.map(call) }, finishReason: 'tool_calls', usage: { inputTokens: 1, outputTokens: 1 }, costUsd: 0.01 });
const answer: ChatResponse = { message: { role: 'assistant', content: 'Done.' }, finishReason: 'stop', usage: { inputTokens: 1, outputTokens: 1 }, costUsd: 0.01 };
const tick = () => new Promise((resolve) => setImmediate(resolve));

class SlowTranscripts implements TranscriptPort {
  inFlight = 0;
  maxInFlight = 0;
  landed: string[] = [];
  failAt = 0;
  load(): Promise<StoredTranscript | null> {
    return Promise.resolve(null);
  }
  async save(_id: string, transcript: StoredTranscript): Promise<void> {
    const n = this.landed.length + 1;
    this.inFlight += 1;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    await tick();
    await tick();
    this.inFlight -= 1;
    if (n === this.failAt) throw new Error(`save ${n} failed`);
    const last = transcript.messages.at(-1);
    this.landed.push(last?.role === 'tool' ? `result ${last.toolCallId}` : (last?.role ?? '?'));
  }
}

function deps(steps: ChatResponse[], transcripts: SlowTranscripts, extra: Partial<SectionDeps> = {}): SectionDeps {
  const provider: ModelProvider = {
    name: 'p',
    contextWindowTokens: 100_000,
    chat: (_request: ChatRequest) => {
      const next = steps.shift();
      return next ? Promise.resolve(next) : Promise.reject(new Error('script ran out'));
    },
  };
  const toolbox: Toolbox = { specs: [{ name: 'search', description: 'd', parameters: { type: 'object' } }], execute: (): Promise<ToolResult> => Promise.resolve({ ok: true, content: 'r' }) };
  return { provider, toolbox, transcripts, signal: new AbortController().signal, random: () => 0.5, ...extra };
}

const unhandled = unhandledRejections();

test('saves never overlap and every tool result lands before the section ends', async () => {
  const transcripts = new SlowTranscripts();
  const outcome = await runSection(spec, deps([toolTurn('a', 'b', 'c'), toolTurn('d'), answer], transcripts, { spend: { beforeCall: async () => { await tick(); }, charge: () => undefined } }));
  expect(outcome.kind).toBe('written');
  expect(transcripts.maxInFlight).toBe(1);
  expect(transcripts.landed).toEqual(['assistant', 'result a', 'result b', 'result c', 'assistant', 'result d', 'assistant']);
});

test('out of time right after the last tool result: that result is on record when the section returns; its failed save is reported', async () => {
  let left = 60_000;
  const ok = new SlowTranscripts();
  const first = await runSection(spec, deps([toolTurn('a')], ok, { remainingMs: () => left, toolbox: { specs: [], execute: () => { left = 0; return Promise.resolve({ ok: true, content: 'r' }); } } }));
  expect(first.kind).toBe('out-of-time');
  expect(ok.landed).toEqual(['assistant', 'result a']);

  left = 60_000;
  const failing = new SlowTranscripts();
  failing.failAt = 2;
  await expect(runSection(spec, deps([toolTurn('a')], failing, { remainingMs: () => left, toolbox: { specs: [], execute: () => { left = 0; return Promise.resolve({ ok: true, content: 'r' }); } } }))).rejects.toThrow('save 2 failed');
});

test('spend refusal beside a failed save: the save failure is reported; beside a good save: the refusal, after the save landed', async () => {
  const refuse = { beforeCall: () => Promise.reject(new SpendLimitReachedError('cap', 1, 1, 0)), charge: () => undefined };
  let first = true;
  const spendOnce = { beforeCall: () => (first ? ((first = false), Promise.resolve()) : refuse.beforeCall()), charge: () => undefined };
  const failing = new SlowTranscripts();
  failing.failAt = 2;
  await expect(runSection(spec, deps([toolTurn('a'), answer], failing, { spend: spendOnce }))).rejects.toThrow('save 2 failed');
  first = true;
  const ok = new SlowTranscripts();
  await expect(runSection(spec, deps([toolTurn('a'), answer], ok, { spend: spendOnce }))).rejects.toBeInstanceOf(SpendLimitReachedError);
  expect(ok.landed).toEqual(['assistant', 'result a']);
  await tick();
  expect(unhandled).toEqual([]);
});

test('aborted while the last result is being saved: the section rejects only after that save settled, and nothing is unhandled', async () => {
  const controller = new AbortController();
  const transcripts = new SlowTranscripts();
  transcripts.failAt = 3;
  const toolbox = { specs: [], execute: (c: ToolCall) => { if (c.id === 'b') setImmediate(() => controller.abort(new Error('lease lost'))); return Promise.resolve({ ok: true, content: 'r' }); } } as Toolbox;
  const run = runSection(spec, deps([toolTurn('a', 'b'), answer], transcripts, { signal: controller.signal, toolbox }));
  await expect(run).rejects.toThrow();
  expect(transcripts.inFlight).toBe(0);
  await tick();
  await tick();
  expect(unhandled).toEqual([]);
});
