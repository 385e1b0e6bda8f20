/**
 * runSection against a scripted provider (a queue of answers and errors), a counting toolbox and
 * an in-memory transcript store. Assertions are on what the provider was sent, what the tools
 * executed, what was saved, and the cost tally. Backoff waits go through injected timers: no sleeps.
 */
import { ManualClock } from '../../functions/src/core/clock';
import type { Timers } from '../../functions/src/core/flusher';
import {
  ContextWindowError,
  MalformedResponseError,
  ProviderRateLimitedError,
  ProviderRequestError,
  ProviderTimeoutError,
  ProviderUnavailableError,
  type ChatMessage,
  type ChatRequest,
  type ChatResponse,
  type ModelProvider,
  type NumberedSource,
  type Source,
  type ToolCall,
} from '../../functions/src/agent/provider';
import {
  addTallies,
  EMPTY_TALLY,
  freshStartNote,
  resolveSectionPolicy,
  runSection,
  type CostTally,
  type SectionDeps,
  type SectionSpec,
  type StoredTranscript,
  type TranscriptPort,
  type UsageEntry,
} from '../../functions/src/agent/section-runner';
import type { Toolbox, ToolResult } from '../../functions/src/agent/tools';
import { citationKey, CITATION_KEY_HEADING } from '../../functions/src/agent/transcript';
import { ManualTimers } from '../support/timers';

// ---------------------------------------------------------------- fakes

/** The worker dies in this model call: it never returns, as for a killed process. */
class Death {
  constructor(readonly onDeath: () => void) {}
}

type Step = ChatResponse | Error | Death | ((request: ChatRequest) => ChatResponse);

class ScriptedProvider implements ModelProvider {
  readonly name = 'scripted';
  /** The messages of every call, copied at call time. */
  readonly received: ChatMessage[][] = [];
  /** The timeoutMs of every call. */
  readonly timeouts: (number | undefined)[] = [];

  constructor(
    private readonly steps: Step[],
    readonly contextWindowTokens = 100_000,
  ) {}

  get calls(): number {
    return this.received.length;
  }

  // Async, so that a step function that throws rejects like a provider would.
  async chat(request: ChatRequest): Promise<ChatResponse> {
    this.received.push(structuredClone([...request.messages]));
    this.timeouts.push(request.timeoutMs);
    const step = this.steps.shift();
    if (step === undefined) throw new Error('the script ran out');
    if (step instanceof Error) throw step;
    if (step instanceof Death) {
      step.onDeath();
      return new Promise<never>(() => undefined);
    }
    return typeof step === 'function' ? step(request) : step;
  }

  get remaining(): number {
    return this.steps.length;
  }
}

class CountingToolbox implements Toolbox {
  readonly specs = [{ name: 'search', description: 'Searches the web', parameters: { type: 'object' } }];
  readonly executions = new Map<string, number>();
  readonly contents = new Map<string, string>();
  /** The sources a call's result carries (none when unset). */
  readonly sources = new Map<string, Source[]>();
  readonly throwFor = new Set<string>();
  beforeExecute: (call: ToolCall) => void = () => undefined;
  /** The worker dies as this call starts: execute never returns and nothing runs (as for a killed process). */
  dieBefore: { readonly callId: string; readonly onDeath: () => void } | null = null;

  execute(call: ToolCall): Promise<ToolResult> {
    if (this.dieBefore?.callId === call.id) {
      this.dieBefore.onDeath();
      return new Promise<never>(() => undefined);
    }
    this.beforeExecute(call);
    this.executions.set(call.id, (this.executions.get(call.id) ?? 0) + 1);
    if (this.throwFor.has(call.id)) return Promise.reject(new Error(`search backend crashed on ${call.id}`));
    const sources = this.sources.get(call.id);
    const content = this.contents.get(call.id) ?? `result of ${call.id}`;
    return Promise.resolve(sources === undefined ? { ok: true, content } : { ok: true, content, sources });
  }

  total(): number {
    return [...this.executions.values()].reduce((sum, count) => sum + count, 0);
  }
}

class MemoryTranscripts implements TranscriptPort {
  readonly saves: StoredTranscript[] = [];
  /** Rejects the save with this number (1-based), once. */
  failSave: { readonly at: number; readonly error: Error } | null = null;

  constructor(private stored: StoredTranscript | null = null) {}

  load(): Promise<StoredTranscript | null> {
    return Promise.resolve(this.stored === null ? null : structuredClone(this.stored));
  }

  save(_sectionId: string, transcript: StoredTranscript): Promise<void> {
    if (this.failSave !== null && this.failSave.at === this.saves.length + 1) return Promise.reject(this.failSave.error);
    const copy = structuredClone(transcript);
    this.saves.push(copy);
    this.stored = copy;
    return Promise.resolve();
  }

  get last(): StoredTranscript {
    const last = this.saves.at(-1);
    if (last === undefined) throw new Error('nothing saved');
    return last;
  }
}

/** Timers that fire on the next macrotask and remember every requested delay. */
class RecordingTimers implements Timers {
  readonly delays: number[] = [];
  setTimeout(callback: () => void, ms: number): unknown {
    this.delays.push(ms);
    return setImmediate(callback);
  }
  clearTimeout(handle: unknown): void {
    clearImmediate(handle as NodeJS.Immediate);
  }
}

// ---------------------------------------------------------------- builders

const spec: SectionSpec = {
  sectionId: 'sec-1',
  promptId: 'prompt-sec-1',
  system: 'You write one section of a research report.',
  prompt: 'Write the section on battery recycling.',
  coldContext: 'Done so far: the introduction and the section on mining.',
  maxToolRounds: 4,
};

const SYSTEM: ChatMessage = { role: 'system', content: spec.system };
const PROMPT: ChatMessage = { role: 'user', content: spec.prompt, promptId: spec.promptId };
const coldPrompt = (generation: number): ChatMessage => ({
  role: 'user',
  content: `${spec.prompt}\n\n${spec.coldContext}\n\n${freshStartNote(generation)}`,
  promptId: spec.promptId,
});
const COLD_PROMPT = coldPrompt(1);

const call = (id: string): ToolCall => ({ id, name: 'search', arguments: `{"q":"${id}"}` });
const ask = (...ids: string[]): ChatMessage => ({ role: 'assistant', content: null, toolCalls: ids.map(call) });
const result = (id: string, content = `result of ${id}`): ChatMessage => ({ role: 'tool', toolCallId: id, name: 'search', content });
const say = (content: string): ChatMessage => ({ role: 'assistant', content });

/** A tool-calling turn: 100 in, 10 out, $0.25. */
const toolTurn = (...ids: string[]): ChatResponse => ({
  message: { role: 'assistant', content: null, toolCalls: ids.map(call) },
  finishReason: 'tool_calls',
  usage: { inputTokens: 100, outputTokens: 10 },
  costUsd: 0.25,
});
/** A final answer: 200 in, 50 out, $0.5. */
const answer = (text: string): ChatResponse => ({
  message: { role: 'assistant', content: text },
  finishReason: 'stop',
  usage: { inputTokens: 200, outputTokens: 50 },
  costUsd: 0.5,
});

const tally = (fields: Partial<CostTally>): CostTally => addTallies(EMPTY_TALLY, fields);

const stored = (messages: ChatMessage[], fields: Partial<StoredTranscript> = {}): StoredTranscript => ({
  generation: 0,
  messages,
  attempts: { warm: 0, cold: 0 },
  tally: tally({ modelCalls: 1, toolCalls: 1 }),
  ...fields,
});

interface Harness {
  readonly provider: ScriptedProvider;
  readonly toolbox: CountingToolbox;
  readonly transcripts: MemoryTranscripts;
  readonly timers: RecordingTimers;
  readonly usage: UsageEntry[];
  readonly controller: AbortController;
  readonly deps: SectionDeps;
}

function harness(
  steps: Step[],
  options: { stored?: StoredTranscript; contextWindowTokens?: number; policy?: SectionDeps['policy']; timers?: Timers; remainingMs?: () => number } = {},
): Harness {
  const provider = new ScriptedProvider(steps, options.contextWindowTokens);
  const toolbox = new CountingToolbox();
  const transcripts = new MemoryTranscripts(options.stored ?? null);
  const timers = new RecordingTimers();
  const usage: UsageEntry[] = [];
  const controller = new AbortController();
  const deps: SectionDeps = {
    provider,
    toolbox,
    transcripts,
    signal: controller.signal,
    policy: { transientMinDelayMs: 100, transientMaxDelayMs: 5_000, ...options.policy },
    random: () => 0.5,
    timers: options.timers ?? timers,
    onUsage: (entry) => usage.push(entry),
    ...(options.remainingMs ? { remainingMs: options.remainingMs } : {}),
  };
  return { provider, toolbox, transcripts, timers, usage, controller, deps };
}

function sumOfUsage(usage: readonly UsageEntry[]): CostTally {
  return usage.reduce((sum, entry) => addTallies(sum, entry.delta), EMPTY_TALLY);
}

// ---------------------------------------------------------------- tests

describe('runSection: first attempt', () => {
  test('a tool result is on record before the next tool runs; the last one is saved while the spend check and the next model call run, and lands before that answer is saved', async () => {
    const h = harness([toolTurn('c1', 'c2'), answer('Done.')]);
    const order: string[] = [];
    const describe = (message: ChatMessage | undefined): string => (message?.role === 'tool' ? `result ${message.toolCallId}` : (message?.role ?? 'nothing'));
    const save = h.transcripts.save.bind(h.transcripts);
    h.transcripts.save = async (sectionId, transcript) => {
      const what = describe(transcript.messages.at(-1));
      order.push(`save ${what} started`);
      // The commit takes a turn of the event loop, as a Firestore round trip does.
      await new Promise((resolve) => setImmediate(resolve));
      await save(sectionId, transcript);
      order.push(`save ${what} landed`);
    };
    h.toolbox.beforeExecute = (toolCall) => order.push(`tool ${toolCall.id}`);
    const chat = h.provider.chat.bind(h.provider);
    h.provider.chat = (request) => {
      order.push('model call');
      return chat(request);
    };
    const deps: SectionDeps = { ...h.deps, spend: { beforeCall: () => Promise.resolve(void order.push('spend check')), charge: () => undefined } };

    expect(await runSection(spec, deps)).toMatchObject({ kind: 'written', text: 'Done.' });
    expect(order).toEqual([
      'spend check',
      'model call',
      'save assistant started',
      'save assistant landed',
      'tool c1',
      'save result c1 started',
      'save result c1 landed',
      'tool c2',
      'save result c2 started',
      'spend check',
      'model call',
      'save result c2 landed',
      'save assistant started',
      'save assistant landed',
    ]);
  });

  test('two tool rounds then an answer: every step saved, each tool run once, after its call was recorded', async () => {
    const h = harness([toolTurn('c1'), toolTurn('c2', 'c3'), answer('Recycling recovers 95% of cobalt.')]);
    h.toolbox.beforeExecute = (toolCall) => {
      const lastSaved = h.transcripts.last.messages.at(-1);
      // The assistant message or a sibling's result is the last thing saved: the call is on record.
      expect(h.transcripts.last.messages.some((m) => m.role === 'assistant' && m.toolCalls?.some((c) => c.id === toolCall.id))).toBe(true);
      expect(lastSaved?.role === 'tool' && lastSaved.toolCallId === toolCall.id).toBe(false);
    };

    const outcome = await runSection(spec, h.deps);

    expect(outcome).toEqual({
      kind: 'written',
      text: 'Recycling recovers 95% of cobalt.',
      sources: [],
      tally: tally({ modelCalls: 3, toolCalls: 3, inputTokens: 400, outputTokens: 70, usd: 1 }),
      attempts: { warm: 0, cold: 0, generation: 0 },
    });
    expect(h.provider.received).toEqual([
      [SYSTEM, PROMPT],
      [SYSTEM, PROMPT, ask('c1'), result('c1')],
      [SYSTEM, PROMPT, ask('c1'), result('c1'), ask('c2', 'c3'), result('c2'), result('c3')],
    ]);
    expect(Object.fromEntries(h.toolbox.executions)).toEqual({ c1: 1, c2: 1, c3: 1 });
    // The first thread is not saved on its own (it is made again the same way); each answer and each result is.
    expect(h.transcripts.saves.map((save) => save.messages.length)).toEqual([3, 4, 5, 6, 7, 8]);
    expect(h.transcripts.saves[0]?.messages.slice(0, 2)).toEqual([SYSTEM, PROMPT]);
    expect(h.transcripts.saves[0]?.generation).toBe(0);
    expect(h.transcripts.last.messages.at(-1)).toEqual(say('Recycling recovers 95% of cobalt.'));
    expect(h.usage.map((entry) => entry.kind)).toEqual(['model_call', 'tool_call', 'model_call', 'tool_call', 'tool_call', 'model_call']);
    expect(sumOfUsage(h.usage)).toEqual(outcome.tally);
  });

  test('ProviderRequestError is terminal: thrown out, no attempt spent', async () => {
    const rejected = new ProviderRequestError('unknown model');
    const h = harness([toolTurn('c1'), rejected, answer('never')]);
    await expect(runSection(spec, h.deps)).rejects.toBe(rejected);
    expect(h.provider.calls).toBe(2);
    expect(h.transcripts.last.attempts).toEqual({ warm: 0, cold: 0 });
    expect(h.transcripts.last.messages).toEqual([SYSTEM, PROMPT, ask('c1'), result('c1')]);
  });

  test('an unclassified provider error is thrown out as it is', async () => {
    const bug = new TypeError('cannot read properties of undefined');
    const h = harness([bug]);
    await expect(runSection(spec, h.deps)).rejects.toBe(bug);
    expect(h.provider.calls).toBe(1);
  });
});

describe('runSection: crash resume', () => {
  test('a stored transcript ending with a complete group: no tool re-run, no prompt re-sent, the next step is a model call', async () => {
    const before = stored([SYSTEM, PROMPT, ask('c1'), result('c1')]);
    const h = harness([answer('Done.')], { stored: before });

    const outcome = await runSection(spec, h.deps);

    expect(outcome).toEqual({
      kind: 'written',
      text: 'Done.',
      sources: [],
      tally: tally({ modelCalls: 2, toolCalls: 1, inputTokens: 200, outputTokens: 50, usd: 0.5 }),
      attempts: { warm: 0, cold: 0, generation: 0 },
    });
    expect(h.provider.received).toEqual([[SYSTEM, PROMPT, ask('c1'), result('c1')]]);
    expect(h.toolbox.total()).toBe(0);
  });

  test('bug 3: an incomplete multi-tool group: its saved result is kept, only the missing call runs, nothing is wasted', async () => {
    const before = stored([SYSTEM, PROMPT, ask('c1'), result('c1'), ask('c2', 'c3'), result('c2')], {
      tally: tally({ modelCalls: 2, toolCalls: 2, inputTokens: 200, outputTokens: 20, usd: 0.5 }),
    });
    const h = harness([toolTurn('c4'), answer('Done.')], { stored: before });

    const outcome = await runSection(spec, h.deps);

    const finished = [SYSTEM, PROMPT, ask('c1'), result('c1'), ask('c2', 'c3'), result('c2'), result('c3')];
    expect(h.transcripts.saves[1]?.messages).toEqual(finished);
    // The model is not asked again for the turn it already gave: the next request carries the whole group.
    expect(h.provider.received[0]).toEqual(finished);
    expect(Object.fromEntries(h.toolbox.executions)).toEqual({ c3: 1, c4: 1 });
    expect(outcome.kind).toBe('written');
    expect(outcome.tally).toEqual(tally({ modelCalls: 4, toolCalls: 4, inputTokens: 500, outputTokens: 80, usd: 1.25 }));
    expect(h.usage.filter((entry) => entry.kind === 'wasted')).toEqual([]);
  });

  test('results recorded out of order are reused in call order', async () => {
    const h = harness([answer('Done.')], { stored: stored([SYSTEM, PROMPT, ask('c1', 'c2'), result('c2'), result('c1')]) });
    await runSection(spec, h.deps);
    expect(h.provider.received).toEqual([[SYSTEM, PROMPT, ask('c1', 'c2'), result('c1'), result('c2')]]);
    expect(h.toolbox.total()).toBe(0);
  });

  test('an answer recorded before the crash is returned without another call', async () => {
    const before = stored([SYSTEM, PROMPT, ask('c1'), result('c1'), say('The recorded section.')], { attempts: { warm: 1, cold: 0 } });
    const h = harness([], { stored: before });
    const outcome = await runSection(spec, h.deps);
    expect(outcome).toEqual({ kind: 'written', text: 'The recorded section.', sources: [], tally: before.tally, attempts: { warm: 1, cold: 0, generation: 0 } });
    expect(h.provider.calls).toBe(0);
    expect(h.transcripts.saves).toEqual([]);
  });

  test('an unsound stored transcript: a clean generation 1 from the prompt and the rolling context, no cold retry spent', async () => {
    const before = stored([SYSTEM, result('ghost'), PROMPT, ask('c1'), result('c1')]);
    const h = harness([answer('Done cold.')], { stored: before });

    const outcome = await runSection(spec, h.deps);

    expect(outcome).toEqual({
      kind: 'written',
      text: 'Done cold.',
      sources: [],
      tally: tally({ modelCalls: 2, toolCalls: 1, inputTokens: 200, outputTokens: 50, usd: 0.5, wastedModelCalls: 1, wastedToolCalls: 2 }),
      attempts: { warm: 0, cold: 0, generation: 1 },
    });
    expect(h.transcripts.saves[0]).toEqual({
      generation: 1,
      messages: [SYSTEM, COLD_PROMPT],
      attempts: { warm: 0, cold: 0 },
      tally: tally({ modelCalls: 1, toolCalls: 1, wastedModelCalls: 1, wastedToolCalls: 2 }),
    });
    expect(h.provider.received).toEqual([[SYSTEM, COLD_PROMPT]]);
    expect(h.toolbox.total()).toBe(0);
  });

  test('a stored transcript of another prompt is not continued', async () => {
    const other: ChatMessage = { role: 'user', content: 'Another section.', promptId: 'prompt-sec-0' };
    const h = harness([answer('Done.')], { stored: stored([SYSTEM, other, ask('c1'), result('c1')], { generation: 3 }) });
    const outcome = await runSection(spec, h.deps);
    expect(outcome.attempts).toEqual({ warm: 0, cold: 0, generation: 4 });
    expect(h.provider.received).toEqual([[SYSTEM, coldPrompt(4)]]);
  });

  test('spent retries survive the crash: with warm retries used up, the next failure goes cold', async () => {
    const before = stored([SYSTEM, PROMPT, ask('c1'), result('c1')], { attempts: { warm: 2, cold: 0 } });
    const h = harness([new MalformedResponseError('bad json'), answer('Done.')], { stored: before });
    const outcome = await runSection(spec, h.deps);
    expect(outcome.attempts).toEqual({ warm: 2, cold: 1, generation: 1 });
    expect(h.provider.received[1]).toEqual([SYSTEM, COLD_PROMPT]);
  });
});

describe('bug 3: a worker killed after each tool result of a multi-call turn', () => {
  test.each([1, 2, 3])(
    'bug 3: killed after result %i of 3: the next worker runs only the calls without a saved result, so every call ID executes once',
    async (killedAfter) => {
      // Worker 1: the model asks for three calls at once; the worker dies right after the k-th result is saved.
      let died: () => void = () => undefined;
      const death = new Promise<void>((resolve) => {
        died = resolve;
      });
      const calls = ['c1', 'c2', 'c3'];
      const first = harness([toolTurn(...calls), new Death(died)]);
      const next = calls[killedAfter];
      if (next !== undefined) first.toolbox.dieBefore = { callId: next, onDeath: died };
      await Promise.race([runSection(spec, first.deps), death]);
      expect(first.transcripts.last.messages.filter((message) => message.role === 'tool')).toHaveLength(killedAfter);

      // Worker 2 finds the stored transcript.
      const second = harness([answer('Done.')], { stored: first.transcripts.last });
      const outcome = await runSection(spec, second.deps);

      // The side effect: executions per call ID, over both workers.
      const executions = Object.fromEntries(calls.map((id) => [id, (first.toolbox.executions.get(id) ?? 0) + (second.toolbox.executions.get(id) ?? 0)]));
      expect(executions).toEqual({ c1: 1, c2: 1, c3: 1 });
      expect([...second.toolbox.executions.keys()]).toEqual(calls.slice(killedAfter));
      // The model is asked once more, on the finished group; it is never asked to redo the turn it gave.
      expect(second.provider.received).toEqual([[SYSTEM, PROMPT, ask(...calls), ...calls.map((id) => result(id))]]);
      expect(outcome).toMatchObject({ kind: 'written', text: 'Done.', attempts: { warm: 0, cold: 0, generation: 0 } });
      expect(outcome.tally.wastedToolCalls).toBe(0);
    },
  );
});

describe('runSection: warm retries', () => {
  test('a malformed response then success: the same thread continues, the prompt is not re-sent', async () => {
    const h = harness([toolTurn('c1'), new MalformedResponseError('not JSON'), answer('Done.')]);

    const outcome = await runSection(spec, h.deps);

    expect(outcome.kind).toBe('written');
    expect(outcome.attempts).toEqual({ warm: 1, cold: 0, generation: 0 });
    expect(h.provider.received).toEqual([
      [SYSTEM, PROMPT],
      [SYSTEM, PROMPT, ask('c1'), result('c1')],
      [SYSTEM, PROMPT, ask('c1'), result('c1')],
    ]);
    expect(h.toolbox.executions.get('c1')).toBe(1);
    expect(outcome.tally).toEqual(tally({ modelCalls: 3, toolCalls: 1, inputTokens: 300, outputTokens: 60, usd: 0.75, wastedModelCalls: 1 }));
  });

  test('bug 3: a tool that throws once: the recorded sibling result is kept, only the failed call runs again (warm)', async () => {
    const h = harness([toolTurn('c1', 'c2'), answer('Done.')]);
    h.toolbox.throwFor.add('c2');
    h.toolbox.beforeExecute = (toolCall) => {
      if (toolCall.id === 'c2' && h.toolbox.executions.get('c2') === 1) h.toolbox.throwFor.delete('c2');
    };

    const outcome = await runSection(spec, h.deps);

    expect(h.provider.received).toEqual([
      [SYSTEM, PROMPT],
      [SYSTEM, PROMPT, ask('c1', 'c2'), result('c1'), result('c2')],
    ]);
    expect(Object.fromEntries(h.toolbox.executions)).toEqual({ c1: 1, c2: 2 });
    expect(outcome.attempts).toEqual({ warm: 1, cold: 0, generation: 0 });
    // Only the failed execution is waste; the model turn and c1's result were used.
    expect(outcome.tally).toEqual(tally({ modelCalls: 2, toolCalls: 3, inputTokens: 300, outputTokens: 60, usd: 0.75, wastedToolCalls: 1 }));
  });

  test('a tool that keeps throwing: warm retries rerun only that call, then a cold thread lets the model choose again', async () => {
    const h = harness([toolTurn('c1', 'c2'), toolTurn('c3'), answer('Done.')]);
    h.toolbox.throwFor.add('c2');

    const outcome = await runSection(spec, h.deps);

    expect(Object.fromEntries(h.toolbox.executions)).toEqual({ c1: 1, c2: 3, c3: 1 });
    expect(h.provider.received).toEqual([
      [SYSTEM, PROMPT],
      [SYSTEM, COLD_PROMPT],
      [SYSTEM, COLD_PROMPT, ask('c3'), result('c3')],
    ]);
    expect(outcome).toMatchObject({ kind: 'written', attempts: { warm: 2, cold: 1, generation: 1 } });
  });

  test('too many tool rounds: the extra round is not executed, the thread is kept', async () => {
    const h = harness([toolTurn('c1'), toolTurn('c2'), answer('Done.')]);
    const outcome = await runSection({ ...spec, maxToolRounds: 1 }, h.deps);
    expect(h.toolbox.executions.has('c2')).toBe(false);
    expect(h.provider.received[2]).toEqual([SYSTEM, PROMPT, ask('c1'), result('c1')]);
    expect(outcome.attempts.warm).toBe(1);
    expect(outcome.tally.wastedModelCalls).toBe(1);
    expect(outcome.tally.wastedOutputTokens).toBe(10);
  });

  test('bug 37: one answer asking for 50 tool calls runs only the first ones the policy allows; the rest get a tool error result and the thread stays valid', async () => {
    const ids = Array.from({ length: 50 }, (_, index) => `c${index + 1}`);
    const h = harness([toolTurn(...ids), answer('Done.')], { policy: { maxToolCallsPerAnswer: 8 } });
    const outcome = await runSection(spec, h.deps);

    expect([...h.toolbox.executions.keys()]).toEqual(ids.slice(0, 8));
    expect(outcome).toMatchObject({ kind: 'written', text: 'Done.', tally: { toolCalls: 8 } });
    // Every call has its result, in order: the extra calls say why they did not run.
    const sent = h.provider.received[1] ?? [];
    expect(sent.slice(0, 3)).toEqual([SYSTEM, PROMPT, ask(...ids)]);
    const results = sent.slice(3);
    expect(results.map((message) => (message.role === 'tool' ? message.toolCallId : message.role))).toEqual(ids);
    expect(results.slice(0, 8)).toEqual(ids.slice(0, 8).map((id) => result(id)));
    for (const refused of results.slice(8)) {
      expect(refused).toMatchObject({ role: 'tool', name: 'search' });
      const content = JSON.parse(refused.content ?? '') as { error: string };
      expect(content.error).toBe('Not run: one answer may ask for at most 8 tool calls and this one asked for 50. Ask again, in a later turn, for what you still need.');
    }
  });

  test('bug 37: the calls past the bound are answered without running after a crash too, and a resumed group runs only its allowed calls', async () => {
    const ids = Array.from({ length: 5 }, (_, index) => `c${index + 1}`);
    // A worker died after c1's result was saved: c2 (allowed) still runs, c3..c5 (past a bound of 2) do not.
    const h = harness([answer('Done.')], { policy: { maxToolCallsPerAnswer: 2 }, stored: stored([SYSTEM, PROMPT, ask(...ids), result('c1')]) });
    const outcome = await runSection(spec, h.deps);
    expect([...h.toolbox.executions.keys()]).toEqual(['c2']);
    expect(outcome).toMatchObject({ kind: 'written', text: 'Done.' });
    const sent = h.provider.received[0] ?? [];
    expect(sent.slice(3).map((message) => (message.role === 'tool' ? message.toolCallId : message.role))).toEqual(ids);
  });

  test('an empty answer is a failed attempt, not a written section', async () => {
    const h = harness([answer('   '), answer('Done.')]);
    const outcome = await runSection(spec, h.deps);
    expect(outcome).toMatchObject({ kind: 'written', text: 'Done.', attempts: { warm: 1, cold: 0, generation: 0 } });
    expect(h.provider.received[1]).toEqual([SYSTEM, PROMPT]);
  });

  test('an answer cut off at the output limit is a failed attempt', async () => {
    const cutOff: ChatResponse = { ...answer('The section begins but'), finishReason: 'length' };
    const h = harness([cutOff, answer('Done.')]);
    const outcome = await runSection(spec, h.deps);
    expect(outcome).toMatchObject({ kind: 'written', text: 'Done.', attempts: { warm: 1, cold: 0, generation: 0 } });
  });

  test('a tool call ID the thread already used is refused before anything runs', async () => {
    const h = harness([toolTurn('c1'), toolTurn('c1'), answer('Done.')]);
    const outcome = await runSection(spec, h.deps);
    expect(h.toolbox.executions.get('c1')).toBe(1);
    expect(h.provider.received[2]).toEqual([SYSTEM, PROMPT, ask('c1'), result('c1')]);
    expect(outcome.attempts.warm).toBe(1);
  });

  test('a context-window error: sanitise, compact (older results first), continue the same thread', async () => {
    const h = harness([toolTurn('c1'), toolTurn('c2'), new ContextWindowError('too long'), answer('Done.')], { contextWindowTokens: 2_000 });
    h.toolbox.contents.set('c1', 'x'.repeat(20_000));

    const outcome = await runSection(spec, h.deps);

    expect(outcome).toMatchObject({ kind: 'written', text: 'Done.', attempts: { warm: 1, cold: 0, generation: 0 } });
    const compacted = [SYSTEM, PROMPT, ask('c1'), result('c1', '[compacted: 20000 characters of search results]'), ask('c2'), result('c2')];
    expect(h.provider.received[3]).toEqual(compacted);
    expect(h.transcripts.saves.find((save) => save.attempts.warm === 1)?.messages).toEqual(compacted);
    expect(h.toolbox.executions.get('c1')).toBe(1);
  });

  test('a context-window error that compaction cannot fix goes cold instead', async () => {
    const h = harness([toolTurn('c1'), new ContextWindowError('too long'), answer('Done.')], { contextWindowTokens: 10 });
    const outcome = await runSection(spec, h.deps);
    expect(outcome.attempts).toEqual({ warm: 0, cold: 1, generation: 1 });
    expect(h.provider.received[2]).toEqual([SYSTEM, COLD_PROMPT]);
  });
});

describe('runSection: clean threads', () => {
  test('every clean thread says it is a fresh start, so no two threads of a section are the same conversation', async () => {
    const bare: SectionSpec = { ...spec, coldContext: '' };
    const h = harness([new MalformedResponseError('1'), new MalformedResponseError('2'), answer('Done.')], { policy: { warmRetries: 0 } });
    await runSection(bare, h.deps);
    const prompts = h.provider.received.map((messages) => messages[1]);
    expect(prompts).toEqual([
      PROMPT,
      { ...PROMPT, content: `${spec.prompt}\n\n${freshStartNote(1)}` },
      { ...PROMPT, content: `${spec.prompt}\n\n${freshStartNote(2)}` },
    ]);
  });
});

describe('runSection: exhausted retries', () => {
  test('warm x2, then cold x2, then skipped with the last error and the waste counted', async () => {
    const h = harness([
      toolTurn('c1'),
      new MalformedResponseError('bad json 1'),
      new MalformedResponseError('bad json 2'),
      new MalformedResponseError('bad json 3'),
      new MalformedResponseError('bad json 4'),
      new MalformedResponseError('bad json 5'),
    ]);

    const outcome = await runSection(spec, h.deps);

    expect(outcome).toEqual({
      kind: 'skipped',
      reason: 'retries exhausted (warm 2/2, cold 2/2); last error: MalformedResponseError: bad json 5',
      tally: tally({
        modelCalls: 6,
        toolCalls: 1,
        inputTokens: 100,
        outputTokens: 10,
        usd: 0.25,
        wastedModelCalls: 6,
        wastedToolCalls: 1,
        wastedInputTokens: 100,
        wastedOutputTokens: 10,
        wastedUsd: 0.25,
      }),
      attempts: { warm: 2, cold: 2, generation: 2 },
    });
    const thread = [SYSTEM, PROMPT, ask('c1'), result('c1')];
    expect(h.provider.received).toEqual([[SYSTEM, PROMPT], thread, thread, thread, [SYSTEM, coldPrompt(1)], [SYSTEM, coldPrompt(2)]]);
    expect(h.toolbox.executions.get('c1')).toBe(1);
    expect(h.transcripts.saves.map((save) => [save.generation, save.attempts.warm, save.attempts.cold])).toContainEqual([2, 2, 2]);
    expect(sumOfUsage(h.usage)).toEqual(outcome.tally);
  });

  test('no retries configured: the first failure skips the section', async () => {
    const h = harness([new ContextWindowError('too long')], { policy: { warmRetries: 0, coldRetries: 0 } });
    const outcome = await runSection(spec, h.deps);
    expect(outcome).toMatchObject({ kind: 'skipped', reason: 'retries exhausted (warm 0/0, cold 0/0); last error: ContextWindowError: too long' });
    expect(h.provider.calls).toBe(1);
  });
});

describe('runSection: transient provider errors', () => {
  test('a 429 with retry-after: waited out in the call, no attempt spent', async () => {
    const h = harness([new ProviderRateLimitedError('slow down', 1_500), answer('Done.')]);

    const outcome = await runSection(spec, h.deps);

    expect(outcome).toMatchObject({ kind: 'written', text: 'Done.', attempts: { warm: 0, cold: 0, generation: 0 } });
    // Full jitter would have waited 50 ms (0.5 x 100); the provider asked for 1500.
    expect(h.timers.delays).toEqual([1_500]);
    expect(h.provider.received).toEqual([
      [SYSTEM, PROMPT],
      [SYSTEM, PROMPT],
    ]);
    expect(outcome.tally).toEqual(tally({ modelCalls: 2, inputTokens: 200, outputTokens: 50, usd: 0.5, wastedModelCalls: 1 }));
  });

  test('without retry-after the wait is full jitter, doubling its ceiling', async () => {
    const h = harness([new ProviderUnavailableError('503'), new ProviderUnavailableError('503'), answer('Done.')]);
    await runSection(spec, h.deps);
    expect(h.timers.delays).toEqual([50, 100]);
  });

  test('a persistent 503 is thrown out after the in-call retries, spending no attempt', async () => {
    const last = new ProviderUnavailableError('503 #4');
    const h = harness([new ProviderUnavailableError('503 #1'), new ProviderUnavailableError('503 #2'), new ProviderUnavailableError('503 #3'), last]);
    await expect(runSection(spec, h.deps)).rejects.toBe(last);
    expect(h.provider.calls).toBe(4);
    expect(h.timers.delays).toHaveLength(3);
    // Nothing to keep: no answer came, and the first thread is made again the same way.
    expect(h.transcripts.saves).toEqual([]);
  });

  test('a retry-after longer than the in-call ceiling is handed to the engine at once', async () => {
    const limited = new ProviderRateLimitedError('come back in a minute', 60_000);
    const h = harness([limited, answer('never')]);
    await expect(runSection(spec, h.deps)).rejects.toBe(limited);
    expect(h.provider.calls).toBe(1);
    expect(h.timers.delays).toEqual([]);
  });

  test('the transient retry budget comes from the policy', async () => {
    const h = harness([new ProviderUnavailableError('503'), answer('never')], { policy: { transientRetries: 0 } });
    await expect(runSection(spec, h.deps)).rejects.toBeInstanceOf(ProviderUnavailableError);
    expect(h.provider.calls).toBe(1);
  });
});

describe("bug 11: every model call and wait fits in the step's remaining time", () => {
  const STEP_MS = 300_000;
  const policy = { callTimeoutMs: 120_000, minCallTimeMs: 10_000 };

  /** A provider that takes `latencyMs` of the injected clock, or gives up at the caller's timeoutMs as a real client does. */
  const slow =
    (clock: ManualClock, latencyMs: number, response: ChatResponse) =>
    (request: ChatRequest): ChatResponse => {
      const limitMs = request.timeoutMs ?? Number.POSITIVE_INFINITY;
      if (latencyMs > limitMs) {
        clock.advance(limitMs);
        throw new ProviderTimeoutError(`no answer within ${limitMs} ms`);
      }
      clock.advance(latencyMs);
      return response;
    };

  function step(clock: ManualClock): () => number {
    const deadlineMs = clock.now() + STEP_MS;
    return () => Math.max(0, deadlineMs - clock.now());
  }

  test('bug 11: a slow provider: calls get at most the time left, the section ends out-of-time at the deadline with its transcript saved, and the next step finishes it', async () => {
    const clock = new ManualClock(0);
    const first = harness([slow(clock, 110_000, toolTurn('c1')), slow(clock, 110_000, toolTurn('c2')), slow(clock, 110_000, toolTurn('c3'))], {
      policy,
      remainingMs: step(clock),
    });

    const outcome = await runSection(spec, first.deps);

    expect(outcome).toMatchObject({ kind: 'out-of-time', attempts: { warm: 0, cold: 0, generation: 0 } });
    expect(clock.now()).toBe(STEP_MS); // never past the step's deadline
    expect(first.provider.timeouts).toEqual([120_000, 120_000, 80_000]);
    expect(first.transcripts.last.messages).toEqual([SYSTEM, PROMPT, ask('c1'), result('c1'), ask('c2'), result('c2')]);

    const second = harness([slow(clock, 110_000, toolTurn('c3')), slow(clock, 110_000, answer('Done.'))], {
      stored: first.transcripts.last,
      policy,
      remainingMs: step(clock),
    });
    const finished = await runSection(spec, second.deps);

    expect(finished).toMatchObject({ kind: 'written', text: 'Done.', attempts: { warm: 0, cold: 0, generation: 0 } });
    expect(second.provider.received[0]).toEqual(first.transcripts.last.messages);
    expect([...first.toolbox.executions.keys(), ...second.toolbox.executions.keys()]).toEqual(['c1', 'c2', 'c3']);
  });

  test('bug 11: a provider that keeps timing out: in-call retries stop at the deadline and the timeout is thrown out (an outage), never slept past', async () => {
    const clock = new ManualClock(0);
    const h = harness(
      [slow(clock, 200_000, answer('never')), slow(clock, 200_000, answer('never')), slow(clock, 200_000, answer('never')), slow(clock, 200_000, answer('never'))],
      { policy, remainingMs: step(clock) },
    );

    await expect(runSection(spec, h.deps)).rejects.toBeInstanceOf(ProviderTimeoutError);

    expect(clock.now()).toBe(STEP_MS);
    expect(h.provider.timeouts).toEqual([120_000, 120_000, 60_000]);
    expect(h.transcripts.saves).toEqual([]);
  });

  test('bug 11: no model call starts with less than minCallTimeMs left: the section is out of time at once', async () => {
    const clock = new ManualClock(0);
    const remainingMs = step(clock);
    clock.advance(STEP_MS - 5_000);
    const h = harness([answer('never')], { policy, remainingMs });

    const outcome = await runSection(spec, h.deps);

    expect(outcome).toMatchObject({ kind: 'out-of-time', reason: '5000 ms left in the step, less than the 10000 ms a model call needs' });
    expect(h.provider.calls).toBe(0);
    expect(h.transcripts.saves).toEqual([]);
  });

  test('bug 11: a retry-after that does not fit in the time left is not slept: the 429 goes to the engine at once', async () => {
    const clock = new ManualClock(0);
    const remainingMs = step(clock);
    clock.advance(STEP_MS - 12_000);
    const limited = new ProviderRateLimitedError('slow down', 4_000);
    const h = harness([limited, answer('never')], { policy, remainingMs });

    await expect(runSection(spec, h.deps)).rejects.toBe(limited);
    expect(h.timers.delays).toEqual([]);
    expect(h.provider.calls).toBe(1);
  });

  test('without a step deadline a call is bounded by callTimeoutMs alone', async () => {
    const h = harness([answer('Done.')], { policy });
    await runSection(spec, h.deps);
    expect(h.provider.timeouts).toEqual([120_000]);
  });
});

describe('runSection: stops', () => {
  test('a failed save is thrown as it is and nothing runs after it', async () => {
    const failure = new Error('ownership lost');
    const h = harness([toolTurn('c1', 'c2'), answer('never')]);
    h.transcripts.failSave = { at: 2, error: failure }; // 1: the answer, 2: c1's result
    await expect(runSection(spec, h.deps)).rejects.toBe(failure);
    expect(Object.fromEntries(h.toolbox.executions)).toEqual({ c1: 1 });
    expect(h.provider.calls).toBe(1);
  });

  test('a failed first save (the first answer) means no tool runs', async () => {
    const failure = new Error('disk full');
    const h = harness([toolTurn('c1'), answer('never')]);
    h.transcripts.failSave = { at: 1, error: failure };
    await expect(runSection(spec, h.deps)).rejects.toBe(failure);
    expect(h.provider.calls).toBe(1);
    expect(h.toolbox.executions.size).toBe(0);
  });

  test('abort during a tool call throws the signal reason and stops at once', async () => {
    const reason = new Error('lease lost');
    const h = harness([toolTurn('c1', 'c2'), answer('never')]);
    h.toolbox.beforeExecute = () => h.controller.abort(reason);
    await expect(runSection(spec, h.deps)).rejects.toBe(reason);
    expect(Object.fromEntries(h.toolbox.executions)).toEqual({ c1: 1 });
    expect(h.provider.calls).toBe(1);
  });

  test('abort during a backoff wait throws the signal reason', async () => {
    const timers = new ManualTimers();
    const reason = new Error('step deadline');
    const h = harness([new ProviderUnavailableError('503'), answer('never')], { timers });
    const running = runSection(spec, h.deps);
    while (timers.size === 0) {
      await new Promise<void>((resolve) => {
        setImmediate(resolve);
      });
    }
    h.controller.abort(reason);
    await expect(running).rejects.toBe(reason);
    expect(h.provider.calls).toBe(1);
    expect(timers.size).toBe(0);
  });

  test('an already aborted signal stops before anything is read', async () => {
    const reason = new Error('cancelled');
    const h = harness([answer('never')]);
    h.controller.abort(reason);
    await expect(runSection(spec, h.deps)).rejects.toBe(reason);
    expect(h.transcripts.saves).toEqual([]);
    expect(h.provider.calls).toBe(0);
  });
});

describe('resolveSectionPolicy', () => {
  test('fills defaults and refuses nonsense', () => {
    expect(resolveSectionPolicy({ warmRetries: 1 })).toMatchObject({ warmRetries: 1, coldRetries: 2, transientRetries: 3 });
    expect(() => resolveSectionPolicy({ coldRetries: -1 })).toThrow('coldRetries');
    expect(() => resolveSectionPolicy({ transientMinDelayMs: 10, transientMaxDelayMs: 5 })).toThrow('transientMinDelayMs');
    expect(() => resolveSectionPolicy({ compactToWindowShare: 0 })).toThrow('compactToWindowShare');
    expect(() => resolveSectionPolicy({ minCallTimeMs: 0 })).toThrow('minCallTimeMs');
    expect(() => resolveSectionPolicy({ callTimeoutMs: 5_000, minCallTimeMs: 10_000 })).toThrow('callTimeoutMs');
  });
});

describe('the tool-round limit holds across steps', () => {
  test('bug 11: a slow model that never stops calling tools is not yielded for ever: the round limit counts rounds already in the transcript, and the section ends skipped', async () => {
    const STEP_MS = 300_000;
    const policy = { callTimeoutMs: 120_000, minCallTimeMs: 10_000 };
    const clock = new ManualClock(0);
    let calls = 0;
    const slowToolTurn = (request: ChatRequest): ChatResponse => {
      const limit = request.timeoutMs ?? Number.POSITIVE_INFINITY;
      if (110_000 > limit) {
        clock.advance(limit);
        throw new ProviderTimeoutError('no answer in time');
      }
      clock.advance(110_000);
      calls += 1;
      return toolTurn(`c${calls}`);
    };
    let stored: StoredTranscript | undefined;
    const outcomes: string[] = [];
    // Each step gets two model calls before its deadline; without the fix every step ends out-of-time.
    for (let step = 0; step < 40 && !outcomes.includes('skipped'); step += 1) {
      const deadline = clock.now() + STEP_MS;
      const run = harness(Array.from({ length: 5 }, () => slowToolTurn), { ...(stored ? { stored } : {}), policy, remainingMs: () => Math.max(0, deadline - clock.now()) });
      outcomes.push((await runSection(spec, run.deps)).kind);
      stored = run.transcripts.last;
    }
    expect(outcomes).toContain('skipped');
  });
});

describe('runSection: sources', () => {
  const source = (name: string, passage = `What ${name} says.`): Source => ({
    url: `https://example.com/${name}`,
    title: `Page ${name}`,
    passage,
    fetchedAt: '2026-01-01T00:00:00.000Z',
  });
  const numbered = (name: string, number: number, passage?: string): NumberedSource => ({ ...source(name, passage), number });
  /** A recorded result with sources: the key in its text, the numbered sources beside it. */
  const sourcedResult = (id: string, sources: NumberedSource[]): ChatMessage => ({
    role: 'tool',
    toolCallId: id,
    name: 'search',
    content: `result of ${id}${citationKey(sources)}`,
    sources,
  });
  const hasSourcesField = (messages: readonly ChatMessage[]): boolean => messages.some((message) => Object.hasOwn(message, 'sources'));

  test('recorded with each result, numbered by first appearance (a URL seen again keeps its number), shown as a key, never sent as a field', async () => {
    const h = harness([toolTurn('c1'), toolTurn('c2'), answer('Cobalt is recovered [1], at scale [3].')]);
    h.toolbox.sources.set('c1', [source('a'), source('b'), source('a')]);
    h.toolbox.sources.set('c2', [source('b', 'A longer passage from b.'), source('c')]);

    const outcome = await runSection(spec, h.deps);

    const saved = h.transcripts.last.messages;
    expect(saved[3]).toEqual(sourcedResult('c1', [numbered('a', 1), numbered('b', 2)]));
    expect(saved[5]).toEqual(sourcedResult('c2', [numbered('b', 2, 'A longer passage from b.'), numbered('c', 3)]));
    expect(String(saved[3]?.content)).toContain(`${CITATION_KEY_HEADING}\n[1] Page a <https://example.com/a>\n[2] Page b <https://example.com/b>`);
    // One per URL, its latest record, by number.
    expect(outcome).toMatchObject({ kind: 'written', sources: [numbered('a', 1), numbered('b', 2, 'A longer passage from b.'), numbered('c', 3)] });
    // The provider reads the key in the text; the field itself never reaches it.
    expect(h.provider.received.every((messages) => !hasSourcesField(messages))).toBe(true);
    expect(h.provider.received[2]?.[5]).toEqual({ role: 'tool', toolCallId: 'c2', name: 'search', content: saved[5]?.content });
  });

  test("the prompt's own sources are numbered first and listed under the prompt; a tool result's repeat keeps that number", async () => {
    const h = harness([toolTurn('c1'), answer('Done [1] [2].')]);
    h.toolbox.sources.set('c1', [source('note'), source('new')]);

    const outcome = await runSection({ ...spec, sources: [source('note')] }, h.deps);

    const prompt = h.transcripts.last.messages[1];
    expect(prompt).toEqual({ role: 'user', content: `${spec.prompt}${citationKey([numbered('note', 1)])}`, promptId: spec.promptId, sources: [numbered('note', 1)] });
    expect(h.transcripts.last.messages[3]).toMatchObject({ sources: [numbered('note', 1), numbered('new', 2)] });
    expect(outcome).toMatchObject({ sources: [numbered('note', 1), numbered('new', 2)] });
    expect(h.provider.received.every((messages) => !hasSourcesField(messages))).toBe(true);
  });

  test('a crash resume keeps the recorded sources: the tool is not run again, new numbers continue after them', async () => {
    const before = stored([SYSTEM, PROMPT, ask('c1'), sourcedResult('c1', [numbered('a', 1), numbered('b', 2)])]);
    const h = harness([toolTurn('c2'), answer('Done [3].')], { stored: before });
    h.toolbox.sources.set('c2', [source('b'), source('c')]);

    const outcome = await runSection(spec, h.deps);

    expect(h.toolbox.executions.get('c1')).toBeUndefined();
    expect(h.transcripts.last.messages[3]).toEqual(before.messages[3]);
    expect(h.transcripts.last.messages[5]).toMatchObject({ sources: [numbered('b', 2), numbered('c', 3)] });
    expect(outcome).toMatchObject({ kind: 'written', sources: [numbered('a', 1), numbered('b', 2), numbered('c', 3)] });
  });

  test('an answer recorded before the crash comes back with the sources of its thread', async () => {
    const before = stored([SYSTEM, PROMPT, ask('c1'), sourcedResult('c1', [numbered('a', 1)]), say('Recorded [1].')]);
    const outcome = await runSection(spec, harness([], { stored: before }).deps);
    expect(outcome).toMatchObject({ kind: 'written', text: 'Recorded [1].', sources: [numbered('a', 1)] });
  });

  test('a warm retry keeps the kept messages with their sources; what it drops goes with its sources', async () => {
    const h = harness([toolTurn('c1'), new MalformedResponseError('garbled'), answer('Done [1].')]);
    h.toolbox.sources.set('c1', [source('a')]);
    const outcome = await runSection(spec, h.deps);
    expect(outcome).toMatchObject({ kind: 'written', attempts: { warm: 1, cold: 0, generation: 0 }, sources: [numbered('a', 1)] });
    expect(h.transcripts.last.messages[3]).toEqual(sourcedResult('c1', [numbered('a', 1)]));
  });

  test('a clean thread drops the sources with the messages and numbers from 1 again', async () => {
    const before = stored([SYSTEM, result('ghost'), PROMPT, ask('c1'), sourcedResult('c1', [numbered('a', 1), numbered('b', 2)])]);
    const h = harness([toolTurn('c2'), answer('Done cold [1].')], { stored: before });
    h.toolbox.sources.set('c2', [source('c')]);

    const outcome = await runSection(spec, h.deps);

    expect(outcome).toMatchObject({ kind: 'written', attempts: { generation: 1 }, sources: [numbered('c', 1)] });
    expect(h.transcripts.saves[0]?.messages).toEqual([SYSTEM, COLD_PROMPT]);
  });
});
