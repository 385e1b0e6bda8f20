/**
 * Which durable saves of a section overlap a model call and which are still waited for, shown with
 * a transcript port whose saves land only when the test says so.
 *
 * Overlaps: the save of a tool group's last result runs while the spend check and the next model
 * call do; it is settled when that call ends. A repeatable call (no external effect) runs beside
 * the saves before it. Still waited for: everything before a call that may have an effect, the
 * final answer before the section returns. Saves never overlap each other; one still waiting for
 * its turn when a newer one is asked for is left to the newer. A failed overlapped save cuts the
 * call short and is the error the section reports.
 */
import { ProviderUnavailableError, type ChatRequest, type ChatResponse, type ModelProvider, type ToolCall } from '../../functions/src/agent/provider';
import { runSection, type SectionDeps, type SectionSpec, type StoredTranscript, type TranscriptPort } from '../../functions/src/agent/section-runner';
import type { Toolbox, ToolResult } from '../../functions/src/agent/tools';
import { z } from 'zod';
import { createToolbox, defineTool, tracedToolbox } from '../../functions/src/agent';
import { createCorpusToolbox, READ_TOOL, SEARCH_TOOL } from '../../functions/src/providers/offline/toolbox';
import { unhandledRejections } from '../support/failures';


const spec: SectionSpec = { sectionId: 's', promptId: 'p', system: 'sys', prompt: 'write', coldContext: '', maxToolRounds: 4 };
const call = (id: string): ToolCall => ({ id, name: 'search', arguments: '{}' });
const toolTurn = (...ids: string[]): ChatResponse => ({ message: { role: 'assistant', content: null, toolCalls: ids.map(call) }, finishReason: 'tool_calls', usage: { inputTokens: 1, outputTokens: 1 }, costUsd: 0.01 });
const answer: ChatResponse = { message: { role: 'assistant', content: 'Done.' }, finishReason: 'stop', usage: { inputTokens: 1, outputTokens: 1 }, costUsd: 0.01 };
const tick = () => new Promise((resolve) => setImmediate(resolve));

function describe(transcript: StoredTranscript): string {
  const last = transcript.messages.at(-1);
  if (last?.role === 'tool') return `result ${last.toolCallId}`;
  if (last?.role === 'assistant') return (last.toolCalls?.length ?? 0) > 0 ? 'calls' : 'answer';
  return last?.role ?? '?';
}

/** Each save waits until the test lands or fails it; `log` shows the order things happened in. */
class DeferredTranscripts implements TranscriptPort {
  readonly log: string[] = [];
  /** Every transcript a save was started with, in order. */
  readonly saved: StoredTranscript[] = [];
  private readonly waiting: { what: string; land: () => void; fail: (error: Error) => void }[] = [];
  load(): Promise<StoredTranscript | null> {
    return Promise.resolve(null);
  }
  save(_id: string, transcript: StoredTranscript): Promise<void> {
    const what = describe(transcript);
    this.log.push(`save ${what} started`);
    this.saved.push(transcript);
    return new Promise<void>((resolve, reject) => {
      this.waiting.push({
        what,
        land: () => {
          this.log.push(`save ${what} landed`);
          resolve();
        },
        fail: (error) => {
          this.log.push(`save ${what} failed`);
          reject(error);
        },
      });
    });
  }
  /** The save in flight, after letting the runner reach it; throws when there is none. */
  async next(what: string): Promise<{ land: () => void; fail: (error: Error) => void }> {
    for (let i = 0; i < 20 && this.waiting.length === 0; i += 1) await tick();
    const pending = this.waiting.shift();
    if (pending === undefined) throw new Error(`no save in flight (expected ${what}); log: ${this.log.join(', ')}`);
    expect(pending.what).toBe(what);
    return pending;
  }
}

/** A model whose calls answer only when the test says so, and which rejects as the provider would when its call is aborted. */
class DeferredModel implements ModelProvider {
  readonly name = 'deferred';
  readonly contextWindowTokens = 100_000;
  readonly signals: AbortSignal[] = [];
  private readonly answers: ((response: ChatResponse) => void)[] = [];
  constructor(
    private readonly log: string[],
    private readonly onAbort: (signal: AbortSignal) => Error = (signal) => signal.reason as Error,
  ) {}
  chat(request: ChatRequest): Promise<ChatResponse> {
    this.log.push('model call');
    this.signals.push(request.signal);
    return new Promise<ChatResponse>((resolve, reject) => {
      request.signal.addEventListener('abort', () => reject(this.onAbort(request.signal)), { once: true });
      this.answers.push(resolve);
    });
  }
  async answer(response: ChatResponse): Promise<void> {
    for (let i = 0; i < 20 && this.answers.length === 0; i += 1) await tick();
    const resolve = this.answers.shift();
    if (resolve === undefined) throw new Error('no model call in flight');
    this.log.push('model answered');
    resolve(response);
  }
}

/**
 * `repeatable`: the toolbox says its tools have no effect (a defined tool without `effect`), or
 * which of them have none; absent, every call counts as effectful.
 */
function deps(transcripts: DeferredTranscripts, provider: ModelProvider, extra: Partial<SectionDeps> = {}, repeatable: boolean | ((name: string) => boolean) = false): SectionDeps {
  const toolbox: Toolbox = {
    specs: [
      { name: 'search', description: 'd', parameters: { type: 'object' } },
      { name: 'send', description: 'd', parameters: { type: 'object' } },
    ],
    execute: (c: ToolCall): Promise<ToolResult> => {
      transcripts.log.push(`tool ${c.id}`);
      return Promise.resolve({ ok: true, content: 'r' });
    },
    ...(repeatable === false ? {} : { repeatable: repeatable === true ? () => true : repeatable }),
  };
  return { provider, toolbox, transcripts, signal: new AbortController().signal, random: () => 0.5, ...extra };
}

const unhandled = unhandledRejections();

test("the last tool result's save overlaps the next model call and lands before that call's answer is saved; with calls that may have effects, the other saves are waited for", async () => {
  const transcripts = new DeferredTranscripts();
  const model = new DeferredModel(transcripts.log);
  const run = runSection(spec, deps(transcripts, model));

  await model.answer(toolTurn('a', 'b'));
  const calls = await transcripts.next('calls');
  await tick();
  // The calls' message is waited for: no tool runs before it lands.
  expect(transcripts.log).not.toContain('tool a');
  calls.land();
  const resultA = await transcripts.next('result a');
  await tick();
  // A result is waited for before the next tool runs.
  expect(transcripts.log).not.toContain('tool b');
  resultA.land();
  const resultB = await transcripts.next('result b');
  // The overlap: the next model call starts while result b is still being saved, and answers before it lands.
  await model.answer(answer);
  await tick();
  expect(transcripts.log).not.toContain('save answer started');
  resultB.land();
  const final = await transcripts.next('answer');
  let settled = false;
  void run.then(() => (settled = true));
  await tick();
  // The final answer is waited for: the section does not return before it is on record.
  expect(settled).toBe(false);
  final.land();
  expect(await run).toMatchObject({ kind: 'written', text: 'Done.' });
  expect(transcripts.log).toEqual([
    'model call',
    'model answered',
    'save calls started',
    'save calls landed',
    'tool a',
    'save result a started',
    'save result a landed',
    'tool b',
    'save result b started',
    'model call',
    'model answered',
    'save result b landed',
    'save answer started',
    'save answer landed',
  ]);
});

// With retries left, an outage would be retried (and the failed save found before the retry's call);
// with none left, it would be thrown as it is. Either way the failed save is what the section reports, at once.
test.each([
  ['with retries left', 3],
  ['on the last retry', 0],
])('a failed overlapped save cuts the model call short and is what the section reports, though the provider calls the abort an outage (%s)', async (_when, transientRetries) => {
  const transcripts = new DeferredTranscripts();
  // A provider that reports every abort as an outage: unless the save's failure is settled first, the runner would retry it.
  const model = new DeferredModel(transcripts.log, () => new ProviderUnavailableError('connection closed'));
  // A backoff that never ends (its timer never fires): the failure must be reported without waiting for a retry.
  const timers = { setTimeout: () => 0, clearTimeout: () => undefined };
  const run = runSection(spec, deps(transcripts, model, { policy: { transientRetries }, timers }));
  let outcome: unknown = 'pending';
  run.catch((error: unknown) => (outcome = error));

  await model.answer(toolTurn('a'));
  (await transcripts.next('calls')).land();
  const resultA = await transcripts.next('result a');
  for (let i = 0; i < 20 && model.signals.length < 2; i += 1) await tick();
  expect(model.signals).toHaveLength(2);
  expect(model.signals[1]?.aborted).toBe(false);
  resultA.fail(new Error('claim lost'));
  for (let i = 0; i < 20 && model.signals[1]?.aborted !== true; i += 1) await tick();
  expect(model.signals[1]?.aborted).toBe(true);

  for (let i = 0; i < 20 && outcome === 'pending'; i += 1) await tick();
  expect(outcome).toEqual(new Error('claim lost'));
  // The call was not tried again, and nothing was saved after the failure.
  expect(transcripts.log.filter((entry) => entry === 'model call')).toHaveLength(2);
  expect(transcripts.log.at(-1)).toBe('save result a failed');
  await tick();
  expect(unhandled).toEqual([]);
});

test('a spend refusal while the last result is being saved: the save is settled first and the refusal reported once it landed', async () => {
  const transcripts = new DeferredTranscripts();
  const model = new DeferredModel(transcripts.log);
  let checks = 0;
  const refusal = new Error('over the cap');
  const spend = { beforeCall: () => (checks++ === 0 ? Promise.resolve() : Promise.reject(refusal)), charge: () => undefined };
  const run = runSection(spec, deps(transcripts, model, { spend }));
  run.catch(() => undefined);

  await model.answer(toolTurn('a'));
  (await transcripts.next('calls')).land();
  const resultA = await transcripts.next('result a');
  let settled = false;
  void run.catch(() => (settled = true));
  await tick();
  await tick();
  expect(settled).toBe(false);
  resultA.land();
  await expect(run).rejects.toBe(refusal);
  expect(transcripts.log.filter((entry) => entry === 'model call')).toHaveLength(1);
  expect(transcripts.log.at(-1)).toBe('save result a landed');
});

test('repeatable calls run beside the saves before them; a save still waiting for its turn is left to the newer one, which holds it', async () => {
  const transcripts = new DeferredTranscripts();
  const model = new DeferredModel(transcripts.log);
  const run = runSection(spec, deps(transcripts, model, {}, true));

  await model.answer(toolTurn('a', 'b'));
  const calls = await transcripts.next('calls');
  for (let i = 0; i < 20 && model.signals.length < 2; i += 1) await tick();
  // Both tools ran, and the next model call started, while the answer that asked for them was still in flight.
  expect(transcripts.log.filter((entry) => entry !== 'save calls started')).toEqual(['model call', 'model answered', 'tool a', 'tool b', 'model call']);
  expect(transcripts.log).toContain('save calls started');
  calls.land();
  // Result a's save was still waiting for its turn when result b's was asked for: one save holds both.
  const results = await transcripts.next('result b');
  expect(transcripts.log).not.toContain('save result a started');
  expect(transcripts.saved.at(-1)?.messages.filter((message) => message.role === 'tool').map((message) => message.toolCallId)).toEqual(['a', 'b']);
  await model.answer(answer);
  await tick();
  // The overlapped save is still on record before the answer is used.
  expect(transcripts.log).not.toContain('save answer started');
  results.land();
  (await transcripts.next('answer')).land();
  expect(await run).toMatchObject({ kind: 'written', text: 'Done.' });
  expect(transcripts.log.filter((entry) => entry.startsWith('tool '))).toEqual(['tool a', 'tool b']);
  expect(transcripts.log.filter((entry) => entry.endsWith(' started'))).toEqual(['save calls started', 'save result b started', 'save answer started']);
});

test('a call that may have an effect waits for the answer and every result before it, even when those calls were repeatable', async () => {
  const transcripts = new DeferredTranscripts();
  const model = new DeferredModel(transcripts.log);
  const run = runSection(spec, deps(transcripts, model, {}, (name) => name === 'search'));
  const mixed: ChatResponse = { ...toolTurn(), message: { role: 'assistant', content: null, toolCalls: [call('a'), { ...call('b'), name: 'send' }] } };

  await model.answer(mixed);
  const calls = await transcripts.next('calls');
  for (let i = 0; i < 20 && !transcripts.log.includes('tool a'); i += 1) await tick();
  expect(transcripts.log).toContain('tool a');
  calls.land();
  const resultA = await transcripts.next('result a');
  await tick();
  await tick();
  // The effectful call waits for the repeatable one's result to be on record.
  expect(transcripts.log).not.toContain('tool b');
  resultA.land();
  (await transcripts.next('result b')).land();
  await model.answer(answer);
  (await transcripts.next('answer')).land();
  expect(await run).toMatchObject({ kind: 'written', text: 'Done.' });
  expect(transcripts.log.indexOf('save result a landed')).toBeLessThan(transcripts.log.indexOf('tool b'));
});

test("a save that fails after the model answered stops the section before any of that answer's repeatable calls runs", async () => {
  const transcripts = new DeferredTranscripts();
  const model = new DeferredModel(transcripts.log);
  const run = runSection(spec, deps(transcripts, model, {}, true));
  run.catch(() => undefined);

  await model.answer(toolTurn('a'));
  (await transcripts.next('calls')).land();
  const resultA = await transcripts.next('result a');
  await model.answer(toolTurn('b'));
  await tick();
  resultA.fail(new Error('claim lost'));
  await expect(run).rejects.toThrow('claim lost');
  expect(transcripts.log.filter((entry) => entry.startsWith('tool '))).toEqual(['tool a']);
  await tick();
  expect(unhandled).toEqual([]);
});

test("bug 51: a save that failed while an answer's repeatable calls run stops them: no further call starts and no model request is sent", async () => {
  const transcripts = new DeferredTranscripts();
  const model = new DeferredModel(transcripts.log);
  const base = deps(transcripts, model, {}, true);
  // Each call takes a moment, as a web search does: the save's failure is known well before the next call would start.
  const slowToolbox: Toolbox = {
    ...base.toolbox,
    execute: async (c: ToolCall): Promise<ToolResult> => {
      transcripts.log.push(`tool ${c.id}`);
      for (let i = 0; i < 10; i += 1) await tick();
      return { ok: true, content: 'r' };
    },
  };
  const run = runSection(spec, { ...base, toolbox: slowToolbox });
  run.catch(() => undefined);

  await model.answer(toolTurn('a', 'b', 'c'));
  // Not a lost claim (the step's signal stays live): the write gave up on an unavailable Firestore.
  (await transcripts.next('calls')).fail(new Error('transcript save failed: UNAVAILABLE after retries'));
  transcripts.log.push('-- save failed --');
  await expect(run).rejects.toThrow('UNAVAILABLE');
  const afterFailure = transcripts.log.slice(transcripts.log.indexOf('-- save failed --') + 1);
  expect(afterFailure.filter((entry) => entry.startsWith('tool ') || entry === 'model call')).toEqual([]);
  expect(transcripts.log.filter((entry) => entry.startsWith('tool '))).toEqual(['tool a']);
  await tick();
  expect(unhandled).toEqual([]);
});

test("bug 51: a save that failed while the group's last repeatable call ran stops the section before the next model request is sent", async () => {
  const transcripts = new DeferredTranscripts();
  const model = new DeferredModel(transcripts.log);
  const base = deps(transcripts, model, {}, true);
  const slowToolbox: Toolbox = {
    ...base.toolbox,
    execute: async (c: ToolCall): Promise<ToolResult> => {
      transcripts.log.push(`tool ${c.id}`);
      for (let i = 0; i < 10; i += 1) await tick();
      return { ok: true, content: 'r' };
    },
  };
  const run = runSection(spec, { ...base, toolbox: slowToolbox });
  run.catch(() => undefined);

  await model.answer(toolTurn('a'));
  (await transcripts.next('calls')).fail(new Error('transcript save failed: UNAVAILABLE after retries'));
  await expect(run).rejects.toThrow('UNAVAILABLE');
  expect(transcripts.log.filter((entry) => entry === 'model call')).toHaveLength(1);
  await tick();
  expect(unhandled).toEqual([]);
});

test('only tools without an effect are repeatable: defined tools say so per tool, traced toolboxes pass it on, a toolbox that does not say counts as effectful', () => {
  const search = defineTool({ name: 'search', description: 'd', input: z.object({}), execute: () => Promise.resolve('r') });
  const send = defineTool({
    name: 'send_note',
    description: 'd',
    input: z.object({}),
    effect: { lookup: () => Promise.resolve({ kind: 'not-found' as const }) },
    execute: () => Promise.resolve({ kind: 'applied' as const, evidence: {} }),
  });
  const toolbox = tracedToolbox(createToolbox([search, send]));
  expect(['search', 'send_note', 'no_such_tool'].map((name) => toolbox.repeatable?.(name))).toEqual([true, false, false]);
  // The offline corpus toolbox searches a bundled corpus: every call is repeatable.
  expect([SEARCH_TOOL, READ_TOOL].map((name) => createCorpusToolbox().repeatable?.(name))).toEqual([true, true]);
});

test("with a port that makes saves behind the work, the final answer's save is handed to it after every save before it, and the section returns without waiting for it", async () => {
  const transcripts = new DeferredTranscripts();
  const behind: StoredTranscript[] = [];
  const port: TranscriptPort = {
    load: () => transcripts.load(),
    save: (id, transcript) => transcripts.save(id, transcript),
    saveBehind: (_id, transcript) => {
      transcripts.log.push(`save ${describe(transcript)} behind`);
      behind.push(transcript);
    },
  };
  const model = new DeferredModel(transcripts.log);
  const run = runSection(spec, { ...deps(transcripts, model), transcripts: port });

  await model.answer(toolTurn('a'));
  (await transcripts.next('calls')).land();
  const resultA = await transcripts.next('result a');
  await model.answer(answer);
  await tick();
  // The answer is not used (nor handed over) before the save it overlapped landed.
  expect(transcripts.log).not.toContain('save answer behind');
  resultA.land();
  expect(await run).toMatchObject({ kind: 'written', text: 'Done.' });
  expect(transcripts.log).toEqual(['model call', 'model answered', 'save calls started', 'save calls landed', 'tool a', 'save result a started', 'model call', 'model answered', 'save result a landed', 'save answer behind']);
  expect(behind).toHaveLength(1);
  expect(behind[0]?.messages.at(-1)).toMatchObject({ role: 'assistant', content: 'Done.' });
});
