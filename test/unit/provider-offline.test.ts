/**
 * The offline provider: a deterministic scripted agent that continues from any sound transcript,
 * and simulated faults (error waves on the injected clock, timeouts, context window, malformed
 * responses, partial tool results) that throw the port's error classes and replay for a seed.
 * Time is a ManualClock; latency goes through a sleep that records and returns at once.
 */
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
} from '../../functions/src/agent/provider';
import type { Toolbox } from '../../functions/src/agent/tools';
import { ManualClock } from '../../functions/src/core/clock';
import { TerminalError } from '../../functions/src/core/errors';
import {
  CORPUS,
  DEFAULT_OFFLINE_SETTINGS,
  OFFLINE_NOTE,
  ToolInterruptedError,
  createCorpusToolbox,
  createOfflineProvider,
  parseOfflineSettings,
  parseOfflineSettingsJson,
  type OfflineSettingsInput,
  type Sleep,
} from '../../functions/src/providers/offline';
import { failureOf } from '../support/failures';

const EPOCH_MS = Date.UTC(2026, 0, 1);
const PROMPT = "Write the section 'Leases and fencing tokens' of a report on how durable job systems survive worker crashes. About 150 words.";

function recordingSleep(): { sleep: Sleep; waits: number[] } {
  const waits: number[] = [];
  return {
    waits,
    sleep: (ms, signal) => {
      waits.push(ms);
      signal.throwIfAborted();
      return Promise.resolve();
    },
  };
}

function setup(seed: number, settings: OfflineSettingsInput = {}, clock = new ManualClock(EPOCH_MS)) {
  const { sleep, waits } = recordingSleep();
  return { provider: createOfflineProvider({ seed, settings, clock, sleep }), toolbox: createCorpusToolbox({ seed, settings }), clock, waits };
}

function start(prompt = PROMPT): ChatMessage[] {
  return [
    { role: 'system', content: 'You are a research assistant. Use the tools.' },
    { role: 'user', content: prompt, promptId: 'section-1' },
  ];
}

function chatRequest(messages: readonly ChatMessage[], toolbox: Toolbox, extra: Partial<ChatRequest> = {}): ChatRequest {
  return { messages, tools: toolbox.specs, signal: new AbortController().signal, ...extra };
}

interface SectionRun {
  readonly messages: ChatMessage[];
  readonly responses: ChatResponse[];
  readonly final: ChatResponse;
}

/** The agent loop a phase would run: model, then every requested tool, until a message without tool calls. */
async function runSection(provider: ModelProvider, toolbox: Toolbox, messages: ChatMessage[], maxTurns = 12): Promise<SectionRun> {
  const responses: ChatResponse[] = [];
  for (let turn = 0; turn < maxTurns; turn += 1) {
    const response = await provider.chat(chatRequest(messages, toolbox));
    responses.push(response);
    messages.push(response.message);
    const calls = response.message.toolCalls ?? [];
    if (calls.length === 0) return { messages, responses, final: response };
    for (const call of calls) {
      const result = await toolbox.execute(call, new AbortController().signal);
      messages.push({ role: 'tool', toolCallId: call.id, name: call.name, content: result.content });
    }
  }
  throw new Error(`no final answer within ${maxTurns} turns`);
}

/** Runs model turns and their tools until `count` tool results are in the transcript. */
async function runUntilToolResults(provider: ModelProvider, toolbox: Toolbox, messages: ChatMessage[], count: number): Promise<ChatMessage[]> {
  while (messages.filter((message) => message.role === 'tool').length < count) {
    const response = await provider.chat(chatRequest(messages, toolbox));
    messages.push(response.message);
    const calls = response.message.toolCalls ?? [];
    if (calls.length === 0) throw new Error('answered before the wanted tool results');
    for (const call of calls) {
      const result = await toolbox.execute(call, new AbortController().signal);
      messages.push({ role: 'tool', toolCallId: call.id, name: call.name, content: result.content });
    }
  }
  return messages;
}

function toolCallsOf(messages: readonly ChatMessage[]) {
  return messages.flatMap((message) => (message.role === 'assistant' ? (message.toolCalls ?? []) : []));
}

describe('offline provider: a scripted research agent', () => {
  it('runs a section: searches, reads, then answers with copied sentences, the honest note and corpus titles as sources', async () => {
    const { provider, toolbox } = setup(1);
    const run = await runSection(provider, toolbox, start());

    expect(provider.name).toBe('offline');
    const calls = toolCallsOf(run.messages);
    expect(calls.filter((call) => call.name === 'search').length).toBeGreaterThanOrEqual(1);
    expect(calls.filter((call) => call.name === 'read').length).toBeGreaterThanOrEqual(2);
    expect(run.responses.slice(0, -1).every((response) => response.finishReason === 'tool_calls')).toBe(true);
    expect(run.final.finishReason).toBe('stop');

    const text = run.final.message.content!;
    const parts = text.split('\n\n');
    expect(parts[0]).toBe(OFFLINE_NOTE);
    expect(OFFLINE_NOTE).toMatch(/Offline simulator: extractive notes from the bundled corpus/);
    const sourcesLine = parts.at(-1)!;
    expect(sourcesLine).toMatch(/^Sources: /);
    expect(sourcesLine).toContain('Leases and fencing tokens');
    const cited = sourcesLine.replace(/^Sources: /, '').replace(/\.$/, '').split('; ');
    for (const title of cited) expect(CORPUS.map((document) => document.title)).toContain(title);

    // Every body sentence is copied from a document the agent read (extractive, not invented).
    const readIds = calls.filter((call) => call.name === 'read').map((call) => (JSON.parse(call.arguments) as { id: string }).id);
    const readTexts = CORPUS.filter((document) => readIds.includes(document.id)).map((document) => document.text.replace(/\s+/g, ' '));
    for (const paragraph of parts.slice(1, -1)) {
      for (const sentence of paragraph.split(/(?<=[.!?])\s+(?=["A-Z0-9])/)) {
        expect(readTexts.some((read) => read.includes(sentence))).toBe(true);
      }
    }
    const bodyWords = parts.slice(1, -1).join(' ').split(/\s+/).length;
    expect(bodyWords).toBeGreaterThanOrEqual(100);
    expect(bodyWords).toBeLessThanOrEqual(200);

    expect(run.final.usage.inputTokens).toBeGreaterThan(500);
    expect(run.final.usage.outputTokens).toBe(Math.ceil(text.length / 4));
    expect(run.final.costUsd).toBe(0);
    expect(provider.stats()).toMatchObject({ calls: run.responses.length, responses: run.responses.length });
    expect(toolbox.stats().total).toBe(calls.length);
  });

  it('takes the length from the words hint in the prompt', async () => {
    const wordsOf = async (hint: string): Promise<number> => {
      const { provider, toolbox } = setup(5);
      const run = await runSection(provider, toolbox, start(`Explain how retries with exponential backoff and jitter protect a recovering service. ${hint}`));
      return run.final.message.content!.split('\n\n').slice(1, -1).join(' ').split(/\s+/).length;
    };
    const short = await wordsOf('About 60 words.');
    const long = await wordsOf('About 300 words.');
    expect(short).toBeLessThanOrEqual(90);
    expect(long).toBeGreaterThanOrEqual(200);
  });

  it('is deterministic: the same seed and transcript give the same message in a fresh instance', async () => {
    const first = await runSection(setup(42).provider, setup(42).toolbox, start());
    const second = await runSection(setup(42).provider, setup(42).toolbox, start());
    expect(second.messages).toEqual(first.messages);

    // Any prefix ending in tool results gives the same next message in a brand-new provider.
    let lastResult = first.messages.findIndex((message) => message.role === 'tool');
    while (first.messages[lastResult + 1]?.role === 'tool') lastResult += 1;
    const prefix = first.messages.slice(0, lastResult + 1);
    const { provider, toolbox } = setup(42);
    const next = await provider.chat(chatRequest(prefix, toolbox));
    expect(next.message).toEqual(first.messages[prefix.length]);
  });

  it('different seeds may take different paths (grouping, number of reads, sentence choice)', async () => {
    const transcripts = new Set<string>();
    for (let seed = 1; seed <= 12; seed += 1) {
      const { provider, toolbox } = setup(seed);
      transcripts.add(JSON.stringify((await runSection(provider, toolbox, start())).messages));
    }
    expect(transcripts.size).toBeGreaterThan(1);
  });

  it('issues multi-call groups (two searches, or several reads, in one message) for some seeds and single calls for others', async () => {
    const groupSizes: number[] = [];
    for (let seed = 1; seed <= 12; seed += 1) {
      const { provider, toolbox } = setup(seed);
      const run = await runSection(provider, toolbox, start());
      for (const message of run.messages) if (message.role === 'assistant' && message.toolCalls !== undefined) groupSizes.push(message.toolCalls.length);
    }
    expect(groupSizes.some((size) => size >= 2)).toBe(true);
    expect(groupSizes).toContain(1);
  });

  it('resumes from a transcript that already holds search results without searching again, and ends where an uninterrupted run ends', async () => {
    for (const seed of [1, 2, 3, 4]) {
      const uninterrupted = await runSection(setup(seed).provider, setup(seed).toolbox, start());
      const searches = toolCallsOf(uninterrupted.messages).filter((call) => call.name === 'search').length;

      // A worker ran the searches, recorded their results, and crashed.
      const crashed = setup(seed);
      const transcript = await runUntilToolResults(crashed.provider, crashed.toolbox, start(), searches);
      expect(transcript.at(-1)?.role).toBe('tool');
      expect(crashed.toolbox.stats().byTool).toEqual({ search: searches });

      // A new worker, a new process: new provider, new toolbox, same seed.
      const resumed = setup(seed);
      const run = await runSection(resumed.provider, resumed.toolbox, transcript);
      expect(resumed.toolbox.stats().byTool['search']).toBeUndefined();
      expect(resumed.toolbox.stats().byTool['read']).toBeGreaterThanOrEqual(1);
      expect(run.messages).toEqual(uninterrupted.messages);
    }
  });

  it('resumes from a transcript that ends with read results without reading those documents again', async () => {
    const seed = 7;
    const uninterrupted = await runSection(setup(seed).provider, setup(seed).toolbox, start());
    const toolResults = uninterrupted.messages.filter((message) => message.role === 'tool').length;
    const crashed = setup(seed);
    const transcript = await runUntilToolResults(crashed.provider, crashed.toolbox, start(), toolResults);
    const alreadyRun = new Set(toolCallsOf(transcript).map((call) => call.id));

    const resumed = setup(seed);
    const run = await runSection(resumed.provider, resumed.toolbox, transcript);
    expect(resumed.toolbox.stats().total).toBe(0);
    expect(Object.keys(resumed.toolbox.stats().byCallId).filter((id) => alreadyRun.has(id))).toEqual([]);
    expect(run.final.message).toEqual(uninterrupted.final.message);
  });

  it('answers a later prompt in the same conversation from its own searches', async () => {
    const { provider, toolbox } = setup(9);
    const first = await runSection(provider, toolbox, start());
    first.messages.push({ role: 'user', content: 'Now write the section on sagas and compensating actions. About 80 words.', promptId: 'section-2' });
    const second = await runSection(provider, toolbox, first.messages);
    expect(second.final.message.content).toContain('Sagas and compensating actions');
    expect(second.final.message.content).not.toBe(first.final.message.content);
  });

  it('refuses a transcript with unresolved tool calls, as a real API does', async () => {
    const { provider, toolbox } = setup(1);
    const messages = start();
    const response = await provider.chat(chatRequest(messages, toolbox));
    messages.push(response.message);
    const error = await failureOf(provider.chat(chatRequest(messages, toolbox)));
    expect(error).toBeInstanceOf(ProviderRequestError);
    expect((error as Error).message).toMatch(/unresolved tool calls/);
    expect(provider.stats().faults.rejected).toBe(1);

    const orphan: ChatMessage[] = [...start(), { role: 'tool', toolCallId: 'nope', name: 'search', content: '{}' }];
    expect(await failureOf(provider.chat(chatRequest(orphan, toolbox)))).toBeInstanceOf(ProviderRequestError);
    expect(await failureOf(provider.chat(chatRequest([{ role: 'system', content: 'hi' }], toolbox)))).toBeInstanceOf(ProviderRequestError);
  });

  it('answers honestly when the corpus has nothing on the prompt, or no tools are offered', async () => {
    const { provider, toolbox } = setup(1);
    const run = await runSection(provider, toolbox, start('Describe photosynthesis in chlorophyll. About 100 words.'));
    expect(run.final.message.content).toContain(OFFLINE_NOTE);
    expect(run.final.message.content).toMatch(/no document that matches/);

    const bare = await provider.chat({ messages: start(), tools: [], signal: new AbortController().signal });
    expect(bare.message.toolCalls).toBeUndefined();
    expect(bare.message.content).toMatch(/no search or read tool was offered/i);
  });

  it('stops at maxOutputTokens with finishReason length', async () => {
    const { provider, toolbox } = setup(1);
    const run = await runSection(provider, toolbox, start());
    const final = await provider.chat(chatRequest(run.messages.slice(0, -1), toolbox, { maxOutputTokens: 20 }));
    expect(final.finishReason).toBe('length');
    expect(final.message.content).toHaveLength(80);
    expect(final.usage.outputTokens).toBe(20);
  });

  it('prices tokens at the simulated rates when they are set', async () => {
    const { provider, toolbox } = setup(1, { inputUsdPer1kTokens: 0.15, outputUsdPer1kTokens: 0.6 });
    const response = await provider.chat(chatRequest(start(), toolbox));
    expect(response.costUsd).toBeCloseTo((response.usage.inputTokens / 1000) * 0.15 + (response.usage.outputTokens / 1000) * 0.6, 12);
    expect(response.costUsd).toBeGreaterThan(0);
  });
});

describe('offline provider: simulated faults', () => {
  const waves: OfflineSettingsInput = {
    epochMs: EPOCH_MS,
    errorWaves: [
      { startMs: 60_000, endMs: 120_000, status: 429, retryAfterMs: 5_000 },
      { startMs: 200_000, endMs: 260_000, status: 503 },
    ],
  };

  it('an error wave fails every call inside its window, for every instance at once, and none outside it', async () => {
    const clock = new ManualClock(EPOCH_MS);
    const workerA = setup(1, waves, clock);
    const workerB = setup(99, waves, clock);
    const call = (worker: ReturnType<typeof setup>) => failureOf(worker.provider.chat(chatRequest(start(), worker.toolbox))).catch(() => 'ok');

    clock.set(EPOCH_MS + 59_999);
    expect(await call(workerA)).toBe('ok');
    clock.set(EPOCH_MS + 60_000);
    for (const worker of [workerA, workerB]) {
      const error = await call(worker);
      expect(error).toBeInstanceOf(ProviderRateLimitedError);
      expect(error).toMatchObject({ retryAfterMs: 5_000, code: 'rate_limited', retryable: true });
    }
    clock.set(EPOCH_MS + 119_999);
    expect(await call(workerB)).toBeInstanceOf(ProviderRateLimitedError);
    clock.set(EPOCH_MS + 120_000);
    expect(await call(workerA)).toBe('ok');
    clock.set(EPOCH_MS + 230_000);
    for (const worker of [workerA, workerB]) {
      const error = await call(worker);
      expect(error).toBeInstanceOf(ProviderUnavailableError);
      expect(error).toMatchObject({ code: 'provider_unavailable', retryAfterMs: undefined });
    }
    clock.set(EPOCH_MS + 260_000);
    expect(await call(workerB)).toBe('ok');
    expect(workerA.provider.stats()).toMatchObject({ calls: 4, responses: 2, faults: { rate_limited: 1, unavailable: 1 } });
  });

  it('a wave is measured from epochMs, not from the Unix epoch', async () => {
    const clock = new ManualClock(EPOCH_MS + 90_000);
    const shifted = setup(1, { ...waves, epochMs: EPOCH_MS + 1_000_000 }, clock);
    expect((await shifted.provider.chat(chatRequest(start(), shifted.toolbox))).finishReason).toBe('tool_calls');
    clock.set(EPOCH_MS + 1_090_000);
    expect(await failureOf(shifted.provider.chat(chatRequest(start(), shifted.toolbox)))).toBeInstanceOf(ProviderRateLimitedError);
  });

  it('timeoutRate 1 waits timeoutMs through the injected sleep, then throws ProviderTimeoutError', async () => {
    const { provider, toolbox, waits } = setup(1, { timeoutRate: 1, timeoutMs: 30_000, latencyMs: 250 });
    const error = await failureOf(provider.chat(chatRequest(start(), toolbox)));
    expect(error).toBeInstanceOf(ProviderTimeoutError);
    expect(error).toMatchObject({ code: 'timeout', retryable: true });
    expect(waits).toEqual([30_000]);
  });

  it("bug 11: an answer slower than the caller's timeoutMs is a timeout at that limit, waited through the injected sleep", async () => {
    const { provider, toolbox, waits } = setup(1, { latencyMs: 200_000 });
    const error = await failureOf(provider.chat(chatRequest(start(), toolbox, { timeoutMs: 45_000 })));
    expect(error).toBeInstanceOf(ProviderTimeoutError);
    expect((error as Error).message).toContain('no answer within 45000 ms');
    expect(waits).toEqual([45_000]);
    expect(provider.stats().faults.timeout).toBe(1);

    // Within the limit the answer arrives after the full latency.
    await provider.chat(chatRequest(start(), toolbox, { timeoutMs: 200_000 }));
    expect(waits).toEqual([45_000, 200_000]);
  });

  it("bug 11: a simulated timeout waits no longer than the caller's timeoutMs", async () => {
    const { provider, toolbox, waits } = setup(1, { timeoutRate: 1, timeoutMs: 30_000 });
    expect(await failureOf(provider.chat(chatRequest(start(), toolbox, { timeoutMs: 12_000 })))).toBeInstanceOf(ProviderTimeoutError);
    expect(waits).toEqual([12_000]);
  });

  it('latency is awaited through the injected sleep on every call, and an abort during it is rethrown', async () => {
    const { provider, toolbox, waits } = setup(1, { latencyMs: 750 });
    await provider.chat(chatRequest(start(), toolbox));
    expect(waits).toEqual([750]);

    const controller = new AbortController();
    const reason = new Error('claim lost');
    const aborting = createOfflineProvider({
      seed: 1,
      settings: { latencyMs: 750 },
      clock: new ManualClock(EPOCH_MS),
      sleep: (_ms, signal) => {
        controller.abort(reason);
        signal.throwIfAborted();
        return Promise.resolve();
      },
    });
    expect(await failureOf(aborting.chat(chatRequest(start(), toolbox, { signal: controller.signal })))).toBe(reason);
  });

  it('a request estimated above contextWindowTokens throws ContextWindowError', async () => {
    const { provider, toolbox } = setup(1, { contextWindowTokens: 1_000 });
    expect(provider.contextWindowTokens).toBe(1_000);
    const small = await provider.chat(chatRequest(start(), toolbox));
    expect(small.usage.inputTokens).toBeLessThan(1_000);
    const long = [...start(), { role: 'user' as const, content: 'lease '.repeat(1_000) }];
    const error = await failureOf(provider.chat(chatRequest(long, toolbox)));
    expect(error).toBeInstanceOf(ContextWindowError);
    expect(error).toMatchObject({ code: 'context_window', retryable: false });
  });

  it('malformedRate 1 throws MalformedResponseError', async () => {
    const { provider, toolbox } = setup(1, { malformedRate: 1 });
    const error = await failureOf(provider.chat(chatRequest(start(), toolbox)));
    expect(error).toBeInstanceOf(MalformedResponseError);
    expect(error).toMatchObject({ code: 'malformed_response', retryable: true });
    expect(provider.stats().faults.malformed).toBe(1);
  });

  it('rates replay for a seed, and a retry of the same request gets a fresh draw', async () => {
    const outcomes = async (seed: number): Promise<string[]> => {
      const { provider, toolbox } = setup(seed, { timeoutRate: 0.3, malformedRate: 0.3 });
      const results: string[] = [];
      for (let attempt = 0; attempt < 24; attempt += 1) {
        results.push(
          await provider.chat(chatRequest(start(), toolbox)).then(
            () => 'ok',
            (error: unknown) => (error as Error).name,
          ),
        );
      }
      return results;
    };
    const first = await outcomes(21);
    expect(await outcomes(21)).toEqual(first);
    expect(new Set(first)).toEqual(new Set(['ok', 'ProviderTimeoutError', 'MalformedResponseError']));
    expect(await outcomes(22)).not.toEqual(first);
  });

  it('partial tool results: the toolbox interrupts the 2nd call of a group the agent issued; the loop can record the 1st and retry the rest', async () => {
    let seed = 1;
    for (; seed < 50; seed += 1) {
      const { provider, toolbox } = setup(seed);
      const first = await provider.chat(chatRequest(start(), toolbox));
      if ((first.message.toolCalls?.length ?? 0) >= 2) break;
    }
    const { provider, toolbox } = setup(seed, { partialToolResultsRate: 1 });
    const messages = start();
    const response = await provider.chat(chatRequest(messages, toolbox));
    const [firstCall, secondCall] = response.message.toolCalls!;
    const signal = new AbortController().signal;
    expect((await toolbox.execute(firstCall!, signal)).ok).toBe(true);
    await expect(toolbox.execute(secondCall!, signal)).rejects.toBeInstanceOf(ToolInterruptedError);
    expect(toolbox.executionsOf(firstCall!.id)).toBe(1);
    expect(toolbox.executionsOf(secondCall!.id)).toBe(1);
  });

  it('counts provider calls whatever their outcome', async () => {
    const { provider, toolbox } = setup(1, { malformedRate: 1 });
    await failureOf(provider.chat(chatRequest(start(), toolbox)));
    await failureOf(provider.chat(chatRequest(start(), toolbox)));
    expect(provider.stats()).toEqual({
      calls: 2,
      responses: 0,
      faults: { rate_limited: 0, unavailable: 0, timeout: 0, context_window: 0, malformed: 2, rejected: 0 },
    });
  });
});

describe('offline simulator settings', () => {
  it('defaults describe a fast, healthy, free provider', () => {
    expect(parseOfflineSettings({})).toEqual(DEFAULT_OFFLINE_SETTINGS);
    expect(DEFAULT_OFFLINE_SETTINGS).toEqual({
      latencyMs: 0,
      timeoutMs: 10_000,
      epochMs: 0,
      errorWaves: [],
      timeoutRate: 0,
      malformedRate: 0,
      partialToolResultsRate: 0,
      contextWindowTokens: 128_000,
      inputUsdPer1kTokens: 0,
      outputUsdPer1kTokens: 0,
    });
  });

  it.each<[string, unknown]>([
    ['a rate above 1', { timeoutRate: 1.5 }],
    ['a negative rate', { malformedRate: -0.1 }],
    ['negative latency', { latencyMs: -1 }],
    ['fractional latency', { latencyMs: 1.5 }],
    ['a wave that ends before it starts', { errorWaves: [{ startMs: 100, endMs: 100, status: 429 }] }],
    ['a wave with a status other than 429 or 503', { errorWaves: [{ startMs: 0, endMs: 100, status: 500 }] }],
    ['an unknown field', { latencyMS: 100 }],
    ['a tiny context window', { contextWindowTokens: 10 }],
    ['not an object', 'fast please'],
  ])('rejects %s', (_label, input) => {
    expect(() => parseOfflineSettings(input)).toThrow(TerminalError);
    expect(() => createOfflineProvider({ seed: 1, settings: input as OfflineSettingsInput, clock: new ManualClock() })).toThrow(/Invalid offline provider settings/);
  });

  it('reads settings from JSON text (an environment variable), blank meaning defaults', () => {
    expect(parseOfflineSettingsJson(undefined)).toEqual(DEFAULT_OFFLINE_SETTINGS);
    expect(parseOfflineSettingsJson('  ')).toEqual(DEFAULT_OFFLINE_SETTINGS);
    expect(parseOfflineSettingsJson('{"latencyMs":40,"errorWaves":[{"startMs":0,"endMs":1000,"status":503,"retryAfterMs":200}]}')).toMatchObject({
      latencyMs: 40,
      errorWaves: [{ startMs: 0, endMs: 1000, status: 503, retryAfterMs: 200 }],
    });
    expect(() => parseOfflineSettingsJson('{latencyMs: 40}')).toThrow(/not valid JSON/);
    expect(() => parseOfflineSettingsJson('{"timeoutRate": 2}')).toThrow(/timeoutRate/);
  });
});


describe('offline provider: streaming', () => {
  /** Runs a section's model calls until the answer is text, returning the last request and its plain answer. */
  async function finalAnswerRequest(): Promise<{ messages: ChatMessage[]; toolbox: Toolbox; plain: ChatResponse }> {
    const { provider, toolbox } = setup(3);
    const messages = start();
    for (let turn = 0; turn < 20; turn += 1) {
      const response = await provider.chat(chatRequest(messages, toolbox));
      if (!response.message.toolCalls) return { messages, toolbox, plain: response };
      messages.push(response.message);
      for (const call of response.message.toolCalls) messages.push({ role: 'tool', toolCallId: call.id, name: call.name, content: (await toolbox.execute(call, new AbortController().signal)).content });
    }
    throw new Error('no text answer in 20 turns');
  }

  it('asked to stream, shows the answer growing at word boundaries over the same latency, and answers exactly as without streaming', async () => {
    const { messages, toolbox, plain } = await finalAnswerRequest();
    const { provider, waits } = setup(3, { latencyMs: 900 });
    const shown: string[] = [];
    const streamed = await provider.chat(chatRequest(messages, toolbox, { onText: (text) => shown.push(text) }));

    expect(streamed).toEqual(plain);
    const content = plain.message.content ?? '';
    expect(shown).toHaveLength(3);
    expect(shown.at(-1)).toBe(content);
    for (const [index, text] of shown.entries()) {
      expect(content.startsWith(text)).toBe(true);
      if (index > 0) expect(text.length).toBeGreaterThan(shown[index - 1]?.length ?? 0);
      if (index < shown.length - 1) expect(content[text.length]).toBe(' ');
    }
    // Half the latency before the answer is decided, the rest in three pieces: the same 900 ms in all.
    expect(waits).toEqual([450, 150, 150, 150]);
  });

  it('a draft callback that throws costs nothing', async () => {
    const { messages, toolbox, plain } = await finalAnswerRequest();
    const { provider } = setup(3);
    const streamed = await provider.chat(
      chatRequest(messages, toolbox, {
        onText: () => {
          throw new Error('the draft sink broke');
        },
      }),
    );
    expect(streamed).toEqual(plain);
  });
});
