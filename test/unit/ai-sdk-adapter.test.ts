/**
 * The AI SDK adapter against the SDK's own mock model (MockLanguageModelV3 from `ai/test`): what the
 * model is asked (the prompt, the tools, one request with the step's abort signal), what the port
 * gets back (text drafts, tool calls with their argument text, usage and cost), what a call cut off
 * midway is billed, and every failure as the port's error class with a finite Retry-After. The
 * only real wait is the timeout case (50 ms).
 */
import type { LanguageModelV3CallOptions, LanguageModelV3StreamPart, LanguageModelV3Usage } from '@ai-sdk/provider';
import { APICallError, JSONParseError, LoadAPIKeyError, TypeValidationError, simulateReadableStream } from 'ai';
import { MockLanguageModelV3 } from 'ai/test';
import {
  ContextWindowError,
  MalformedResponseError,
  ProviderRateLimitedError,
  ProviderRequestError,
  ProviderTimeoutError,
  ProviderUnavailableError,
  isProviderOutage,
  type BilledCall,
  type ChatMessage,
  type ChatRequest,
  type ToolSpec,
} from '../../functions/src/agent/provider';
import { ManualClock } from '../../functions/src/core/clock';
import { TerminalError } from '../../functions/src/core/errors';
import { capServerDelay } from '../../functions/src/core/server-delay';
import { createAiSdkProvider, type AiSdkProviderOptions } from '../../functions/src/providers/ai-sdk';
import { failureOf } from '../support/failures';

const NOW = Date.UTC(2026, 4, 1);
const clock = new ManualClock(NOW);

const settings = { timeoutMs: 5_000, contextWindowTokens: 200_000, inputUsdPer1kTokens: 0.5, outputUsdPer1kTokens: 2 } as const;

const question: readonly ChatMessage[] = [
  { role: 'system', content: 'You research leases.' },
  { role: 'user', content: 'What is a lease?', promptId: 'p1' },
];

const searchTool: ToolSpec = {
  name: 'search',
  description: 'Searches the corpus',
  parameters: { type: 'object', properties: { query: { type: 'string' } }, required: ['query'] },
};

function usage(input: number | undefined, output: number | undefined): LanguageModelV3Usage {
  return {
    inputTokens: { total: input, noCache: input, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: output, text: output, reasoning: undefined },
  };
}

const start: LanguageModelV3StreamPart = { type: 'stream-start', warnings: [] };
const metadata: LanguageModelV3StreamPart = { type: 'response-metadata', id: 'resp-1', modelId: 'mock-model-id', timestamp: new Date(NOW) };
const finish = (unified: 'stop' | 'length' | 'content-filter' | 'tool-calls' | 'other', raw: string | undefined, reported = usage(1000, 500)): LanguageModelV3StreamPart => ({
  type: 'finish',
  finishReason: { unified, raw },
  usage: reported,
});
const text = (...pieces: string[]): LanguageModelV3StreamPart[] => [
  { type: 'text-start', id: 't0' },
  ...pieces.map((delta): LanguageModelV3StreamPart => ({ type: 'text-delta', id: 't0', delta })),
  { type: 'text-end', id: 't0' },
];

/** A mock model that streams these parts, in order, at once. */
function streaming(parts: readonly LanguageModelV3StreamPart[]): MockLanguageModelV3 {
  return new MockLanguageModelV3({ doStream: () => Promise.resolve({ stream: simulateReadableStream({ chunks: [...parts], initialDelayInMs: null, chunkDelayInMs: null }) }) });
}

/** A mock model whose request fails before any answer, with this error. */
function failing(error: Error): MockLanguageModelV3 {
  return new MockLanguageModelV3({ doStream: () => Promise.reject(error) });
}

/** A mock model that streams `parts` and then neither finishes nor fails until its abort signal fires. */
function stalling(parts: readonly LanguageModelV3StreamPart[]): MockLanguageModelV3 {
  return new MockLanguageModelV3({
    doStream: (options: LanguageModelV3CallOptions) =>
      Promise.resolve({
        stream: new ReadableStream<LanguageModelV3StreamPart>({
          start(controller) {
            for (const part of parts) controller.enqueue(part);
            const signal = options.abortSignal;
            signal?.addEventListener('abort', () => controller.error(signal.reason), { once: true });
          },
        }),
      }),
  });
}

function apiError(statusCode: number | undefined, message: string, headers: Record<string, string> = {}, data?: unknown): APICallError {
  return new APICallError({
    message,
    url: 'https://models.example/v1/chat',
    requestBodyValues: {},
    ...(statusCode === undefined ? {} : { statusCode }),
    responseHeaders: headers,
    responseBody: JSON.stringify(data ?? { error: { message } }),
    // The SDK marks these retryable: with its retries on, it would have asked again unseen.
    isRetryable: statusCode === undefined || statusCode === 429 || statusCode >= 500,
    ...(data === undefined ? {} : { data }),
  });
}

const provider = (model: MockLanguageModelV3, extra: Partial<AiSdkProviderOptions> = {}) => createAiSdkProvider({ model, ...settings, ...extra }, { clock });

function request(extra: Partial<ChatRequest> = {}): ChatRequest {
  return { messages: question, tools: [], signal: new AbortController().signal, ...extra };
}

/** What the estimate counts as input when the model reports no usage: the request as text, four characters a token. */
const estimatedInputTokens = (messages: readonly ChatMessage[], tools: readonly ToolSpec[]) => Math.ceil(JSON.stringify({ messages, tools }).length / 4);

describe('AI SDK adapter: text', () => {
  it('streams the text through onText as it grows and returns the whole answer with its reported usage and cost', async () => {
    const model = streaming([start, metadata, ...text('A lease ', 'is a claim ', 'with an expiry.'), finish('stop', 'stop')]);
    const drafts: string[] = [];
    const response = await provider(model).chat(request({ onText: (textSoFar) => drafts.push(textSoFar), maxOutputTokens: 256 }));
    expect(drafts).toEqual(['A lease ', 'A lease is a claim ', 'A lease is a claim with an expiry.']);
    expect(response).toEqual({
      message: { role: 'assistant', content: 'A lease is a claim with an expiry.' },
      finishReason: 'stop',
      usage: { inputTokens: 1000, outputTokens: 500 },
      // 1000 / 1000 * 0.5 + 500 / 1000 * 2
      costUsd: 1.5,
    });
    expect(model.doStreamCalls).toHaveLength(1);
    const call = model.doStreamCalls[0]!;
    expect(call.maxOutputTokens).toBe(256);
    expect(call.tools).toBeUndefined();
    expect(call.prompt).toEqual([
      { role: 'system', content: 'You research leases.' },
      { role: 'user', content: [{ type: 'text', text: 'What is a lease?' }] },
    ]);
  });

  it('names itself after the model, and takes a name given', () => {
    const model = streaming([]);
    expect(provider(model).name).toBe('ai-sdk:mock-provider:mock-model-id');
    expect(provider(model, { name: 'anthropic-sonnet' }).name).toBe('anthropic-sonnet');
    expect(provider(model).contextWindowTokens).toBe(200_000);
  });

  it('reports a length stop as length', async () => {
    const response = await provider(streaming([start, ...text('Cut at the'), finish('length', 'length', usage(10, 4))])).chat(request());
    expect(response.finishReason).toBe('length');
    expect(response.message.content).toBe('Cut at the');
    expect(response.costUsd).toBeCloseTo((10 / 1000) * 0.5 + (4 / 1000) * 2, 12);
  });

  it('passes provider options through to the model', async () => {
    const model = streaming([start, ...text('ok'), finish('stop', 'stop')]);
    await provider(model, { providerOptions: { anthropic: { thinking: { type: 'enabled', budgetTokens: 1024 } } } }).chat(request());
    expect(model.doStreamCalls[0]!.providerOptions).toEqual({ anthropic: { thinking: { type: 'enabled', budgetTokens: 1024 } } });
  });

  it('a draft sink that throws costs nothing: the answer still arrives', async () => {
    const response = await provider(streaming([start, ...text('fine'), finish('stop', 'stop')])).chat(
      request({
        onText: () => {
          throw new Error('the draft sink broke');
        },
      }),
    );
    expect(response.message.content).toBe('fine');
  });
});

describe('AI SDK adapter: tool calls', () => {
  it('assembles streamed tool calls with their argument text exactly as written, and asks no more than one step', async () => {
    const model = streaming([
      start,
      metadata,
      { type: 'tool-input-start', id: 'call_1', toolName: 'search' },
      { type: 'tool-input-delta', id: 'call_1', delta: '{"query": ' },
      { type: 'tool-input-delta', id: 'call_1', delta: '"lease expiry"}' },
      { type: 'tool-input-end', id: 'call_1' },
      { type: 'tool-call', toolCallId: 'call_1', toolName: 'search', input: '{"query": "lease expiry"}' },
      // A call that arrives whole, as some providers send them, and one for a tool nobody declared.
      { type: 'tool-call', toolCallId: 'call_2', toolName: 'search', input: '{"query":"fencing"}' },
      { type: 'tool-call', toolCallId: 'call_3', toolName: 'no_such_tool', input: '{"x":1}' },
      finish('tool-calls', 'tool_calls', usage(1200, 80)),
    ]);
    const drafts: string[] = [];
    const response = await provider(model).chat(request({ tools: [searchTool], onText: (textSoFar) => drafts.push(textSoFar) }));
    expect(response).toEqual({
      message: {
        role: 'assistant',
        content: null,
        toolCalls: [
          { id: 'call_1', name: 'search', arguments: '{"query": "lease expiry"}' },
          { id: 'call_2', name: 'search', arguments: '{"query":"fencing"}' },
          // Unknown to the tool set: the engine's toolbox answers it, the adapter does not drop it.
          { id: 'call_3', name: 'no_such_tool', arguments: '{"x":1}' },
        ],
      },
      finishReason: 'tool_calls',
      usage: { inputTokens: 1200, outputTokens: 80 },
      costUsd: (1200 / 1000) * 0.5 + (80 / 1000) * 2,
    });
    expect(drafts).toEqual([]);
    expect(model.doStreamCalls).toHaveLength(1);
    expect(model.doStreamCalls[0]!.tools).toEqual([
      { type: 'function', name: 'search', description: 'Searches the corpus', inputSchema: searchTool.parameters, providerOptions: undefined },
    ]);
  });

  it('a call whose input was announced but not streamed in pieces keeps the input it arrived with', async () => {
    const response = await provider(
      streaming([
        start,
        { type: 'tool-input-start', id: 'c1', toolName: 'search' },
        { type: 'tool-input-end', id: 'c1' },
        { type: 'tool-call', toolCallId: 'c1', toolName: 'search', input: '{"query":"whole"}' },
        finish('tool-calls', 'tool_calls', usage(10, undefined)),
      ]),
    ).chat(request({ tools: [searchTool] }));
    expect(response.message.toolCalls).toEqual([{ id: 'c1', name: 'search', arguments: '{"query":"whole"}' }]);
    // 'search' 6 + '{"query":"whole"}' 17 = 23 characters, 6 tokens.
    expect(response.usage.outputTokens).toBe(6);
  });

  it('keeps text written beside the tool calls', async () => {
    const response = await provider(
      streaming([start, ...text('Let me look that up.'), { type: 'tool-call', toolCallId: 'c1', toolName: 'search', input: '{"query":"x"}' }, finish('tool-calls', 'tool_calls')]),
    ).chat(request({ tools: [searchTool] }));
    expect(response.message).toEqual({ role: 'assistant', content: 'Let me look that up.', toolCalls: [{ id: 'c1', name: 'search', arguments: '{"query":"x"}' }] });
  });

  it('hands a transcript with tool calls and results to the model as SDK messages', async () => {
    const model = streaming([start, ...text('Done.'), finish('stop', 'stop')]);
    const transcript: ChatMessage[] = [
      ...question,
      { role: 'assistant', content: null, toolCalls: [{ id: 'call_1', name: 'search', arguments: '{"query":"lease"}' }] },
      { role: 'tool', toolCallId: 'call_1', name: 'search', content: '[1] A lease is a claim that expires.' },
      { role: 'assistant', content: 'Checking once more.', toolCalls: [{ id: 'call_2', name: 'search', arguments: 'not json' }] },
      { role: 'tool', toolCallId: 'call_2', name: 'search', content: 'error: arguments are not JSON' },
    ];
    await provider(model).chat(request({ messages: transcript, tools: [searchTool] }));
    expect(model.doStreamCalls[0]!.prompt.slice(2)).toEqual([
      { role: 'assistant', content: [{ type: 'tool-call', toolCallId: 'call_1', toolName: 'search', input: { query: 'lease' }, providerExecuted: undefined, providerOptions: undefined }] },
      { role: 'tool', content: [{ type: 'tool-result', toolCallId: 'call_1', toolName: 'search', output: { type: 'text', value: '[1] A lease is a claim that expires.' }, providerOptions: undefined }] },
      {
        role: 'assistant',
        content: [
          { type: 'text', text: 'Checking once more.', providerOptions: undefined },
          // Arguments the model wrote that are not JSON go back as it wrote them.
          { type: 'tool-call', toolCallId: 'call_2', toolName: 'search', input: 'not json', providerExecuted: undefined, providerOptions: undefined },
        ],
      },
      { role: 'tool', content: [{ type: 'tool-result', toolCallId: 'call_2', toolName: 'search', output: { type: 'text', value: 'error: arguments are not JSON' }, providerOptions: undefined }] },
    ]);
  });
});

describe('AI SDK adapter: usage and what a cut-off call is billed', () => {
  it('estimates usage at four characters a token when the model reports none', async () => {
    const answer = 'Twelve chars';
    const response = await provider(streaming([start, ...text(answer), finish('stop', 'stop', usage(undefined, undefined))])).chat(request());
    const inputTokens = estimatedInputTokens(question, []);
    expect(response.usage).toEqual({ inputTokens, outputTokens: 3 });
    expect(response.costUsd).toBeCloseTo((inputTokens / 1000) * 0.5 + (3 / 1000) * 2, 12);
  });

  it('counts streamed reasoning and tool-call text in the output estimate', async () => {
    const response = await provider(
      streaming([
        start,
        { type: 'reasoning-start', id: 'r0' },
        { type: 'reasoning-delta', id: 'r0', delta: 'think' },
        { type: 'reasoning-end', id: 'r0' },
        { type: 'tool-input-start', id: 'c1', toolName: 'search' },
        { type: 'tool-input-delta', id: 'c1', delta: '{"query":"x"}' },
        { type: 'tool-input-end', id: 'c1' },
        { type: 'tool-call', toolCallId: 'c1', toolName: 'search', input: '{"query":"x"}' },
        finish('tool-calls', 'tool_calls', usage(40, undefined)),
      ]),
    ).chat(request({ tools: [searchTool] }));
    // 'think' 5 + 'search' 6 + '{"query":"x"}' 13 = 24 characters.
    expect(response.usage).toEqual({ inputTokens: 40, outputTokens: 6 });
  });

  it('bills a call the caller aborts midway, inside the abort, with what was streamed, and fails with the abort reason', async () => {
    const controller = new AbortController();
    const reason = new Error('cancelled by its owner');
    const billed: BilledCall[] = [];
    const model = stalling([start, metadata, { type: 'text-start', id: 't0' }, { type: 'text-delta', id: 't0', delta: 'Sixteen chars!!!' }]);
    const error = await failureOf(
      provider(model).chat(
        request({
          signal: controller.signal,
          onText: () => {
            controller.abort(reason);
            // Told synchronously, inside the abort itself.
            expect(billed).toHaveLength(1);
          },
          onBilledAfterAbort: (call) => billed.push(call),
        }),
      ),
    );
    expect(error).toBe(reason);
    const inputTokens = estimatedInputTokens(question, []);
    expect(billed).toEqual([{ usage: { inputTokens, outputTokens: 4 }, costUsd: (inputTokens / 1000) * 0.5 + (4 / 1000) * 2 }]);
  });

  it('bills nothing for a call aborted before the model began to answer', async () => {
    const controller = new AbortController();
    const reason = new Error('lost the claim');
    const billed: BilledCall[] = [];
    const model = new MockLanguageModelV3({
      doStream: (options: LanguageModelV3CallOptions) => {
        controller.abort(reason);
        // The SDK's provider packages stop at an aborted signal before any answer arrives.
        return Promise.reject(options.abortSignal?.reason instanceof Error ? options.abortSignal.reason : new Error('not aborted'));
      },
    });
    const error = await failureOf(provider(model).chat(request({ signal: controller.signal, onBilledAfterAbort: (call) => billed.push(call) })));
    expect(error).toBe(reason);
    expect(billed).toEqual([]);
  });

  it('a stream that fails midway is unavailable, carrying the estimate of what was streamed', async () => {
    const model = streaming([start, ...text('Eight ch'), { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }]);
    const error = await failureOf(provider(model).chat(request()));
    expect(error).toBeInstanceOf(ProviderUnavailableError);
    expect((error as Error).message).toContain('Overloaded');
    const inputTokens = estimatedInputTokens(question, []);
    expect((error as ProviderUnavailableError).billedUsd).toBeCloseTo((inputTokens / 1000) * 0.5 + (2 / 1000) * 2, 12);
  });

  it('a stream whose connection breaks midway is unavailable, carrying the estimate', async () => {
    const parts: LanguageModelV3StreamPart[] = [start, metadata, { type: 'text-start', id: 't0' }, { type: 'text-delta', id: 't0', delta: 'abcd' }];
    const model = new MockLanguageModelV3({
      doStream: () =>
        Promise.resolve({
          // Each part once it is read, then the socket's failure (an errored stream drops parts not yet read).
          stream: new ReadableStream<LanguageModelV3StreamPart>({
            pull(controller) {
              const part = parts.shift();
              if (part === undefined) controller.error(new TypeError('terminated'));
              else controller.enqueue(part);
            },
          }),
        }),
    });
    const error = await failureOf(provider(model).chat(request()));
    expect(error).toBeInstanceOf(ProviderUnavailableError);
    const inputTokens = estimatedInputTokens(question, []);
    expect((error as ProviderUnavailableError).billedUsd).toBeCloseTo((inputTokens / 1000) * 0.5 + (1 / 1000) * 2, 12);
  });

  it('a stream that ends without a finish is unavailable, never a shorter answer', async () => {
    const error = await failureOf(provider(streaming([start, ...text('half an ans')])).chat(request()));
    expect(error).toBeInstanceOf(ProviderUnavailableError);
    expect((error as Error).message).toMatch(/ended before the answer was finished/);
    expect((error as ProviderUnavailableError).billedUsd).toBeGreaterThan(0);
  });

  it('a finish the provider did not name ("other", no raw reason) is not taken as an answer', async () => {
    const error = await failureOf(provider(streaming([start, ...text('half'), finish('other', undefined)])).chat(request()));
    expect(error).toBeInstanceOf(ProviderUnavailableError);
    // Billed from the usage it reported.
    expect((error as ProviderUnavailableError).billedUsd).toBe(1.5);
  });

  it("a content filter's stop is a refused request, billed", async () => {
    const error = await failureOf(provider(streaming([start, ...text('I will not'), finish('content-filter', 'content_filter')])).chat(request()));
    expect(error).toBeInstanceOf(ProviderRequestError);
    expect((error as ProviderRequestError).billedUsd).toBe(1.5);
  });

  it('an answer with neither text nor tool calls is malformed, billed', async () => {
    const error = await failureOf(provider(streaming([start, metadata, finish('stop', 'stop')])).chat(request()));
    expect(error).toBeInstanceOf(MalformedResponseError);
    expect((error as MalformedResponseError).billedUsd).toBe(1.5);
  });
});

describe('AI SDK adapter: errors become the port error classes, each from one request', () => {
  it.each([
    ['429', apiError(429, 'Rate limit reached', { 'retry-after': '7' }), ProviderRateLimitedError, 'rate_limited', 7_000],
    ['503 with Retry-After', apiError(503, 'Service unavailable', { 'Retry-After': '2' }), ProviderUnavailableError, 'provider_unavailable', 2_000],
    ['500', apiError(500, 'Internal error'), ProviderUnavailableError, 'provider_unavailable', undefined],
    ['529 overloaded', apiError(529, 'Overloaded', {}, { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }), ProviderUnavailableError, 'provider_unavailable', undefined],
    ['no answer at all (connection refused)', apiError(undefined, 'Cannot connect to API: connect ECONNREFUSED'), ProviderUnavailableError, 'provider_unavailable', undefined],
    ['408', apiError(408, 'Request timeout'), ProviderTimeoutError, 'timeout', undefined],
  ] as const)('%s is an outage the engine retries', async (_label, thrown, errorClass, code, retryAfterMs) => {
    const model = failing(thrown);
    const error = await failureOf(provider(model).chat(request()));
    expect(error).toBeInstanceOf(errorClass);
    expect(error).toMatchObject({ code, retryable: true, retryAfterMs, billedUsd: undefined });
    expect(isProviderOutage(error)).toBe(true);
    // The SDK's retries are off: the model was asked once, even for errors the SDK calls retryable.
    expect(model.doStreamCalls).toHaveLength(1);
  });

  it.each([
    ['400 that names the context length', apiError(400, "This model's maximum context length is 8192 tokens"), ContextWindowError, 'context_window'],
    ['400 with the context code', apiError(400, 'Too long', {}, { error: { message: 'Too long', code: 'context_length_exceeded' } }), ContextWindowError, 'context_window'],
    ["Anthropic's 400 prompt is too long", apiError(400, 'prompt is too long: 210000 tokens > 200000 maximum', {}, { type: 'error', error: { type: 'invalid_request_error', message: 'prompt is too long' } }), ContextWindowError, 'context_window'],
    ['413', apiError(413, 'Request too large'), ContextWindowError, 'context_window'],
    ['400', apiError(400, 'Invalid schema for function search'), ProviderRequestError, 'provider_rejected'],
    ['401 (bad key)', apiError(401, 'Incorrect API key provided'), ProviderRequestError, 'provider_rejected'],
    ['403', apiError(403, 'Forbidden'), ProviderRequestError, 'provider_rejected'],
    ['404 (unknown model)', apiError(404, 'The model does not exist'), ProviderRequestError, 'provider_rejected'],
    ['a missing API key', new LoadAPIKeyError({ message: 'Anthropic API key is missing' }), ProviderRequestError, 'provider_rejected'],
  ] as const)('%s is not retried as it stands', async (_label, thrown, errorClass, code) => {
    const error = await failureOf(provider(failing(thrown)).chat(request()));
    expect(error).toBeInstanceOf(errorClass);
    expect(error).toMatchObject({ code, retryable: false });
    expect(isProviderOutage(error)).toBe(false);
  });

  it("an answer that broke while it was read (the SDK's HTTP 200 wrapper) is unavailable; one that would not parse is malformed", async () => {
    const broken = new APICallError({ message: 'Failed to process successful response', url: 'u', requestBodyValues: {}, statusCode: 200, cause: new TypeError('terminated') });
    const brokenError = await failureOf(provider(streaming([start, ...text('Half'), { type: 'error', error: broken }])).chat(request()));
    expect(brokenError).toBeInstanceOf(ProviderUnavailableError);
    expect((brokenError as Error).message).toContain('broke off after HTTP 200: terminated');
    expect((brokenError as ProviderUnavailableError).billedUsd).toBeGreaterThan(0);
    const unparsed = new APICallError({ message: 'Failed to process successful response', url: 'u', requestBodyValues: {}, statusCode: 200, cause: new JSONParseError({ text: '{"cho', cause: new SyntaxError('Unexpected end') }) });
    expect(await failureOf(provider(failing(unparsed)).chat(request()))).toBeInstanceOf(MalformedResponseError);
  });

  it('a response the model cannot parse is malformed (retryable, not an outage)', async () => {
    const thrown = new TypeValidationError({ value: { choices: 'none' }, cause: new Error('expected an array') });
    const error = await failureOf(provider(streaming([start, { type: 'error', error: thrown }])).chat(request()));
    expect(error).toBeInstanceOf(MalformedResponseError);
    expect(error).toMatchObject({ code: 'malformed_response', retryable: true });
    expect(isProviderOutage(error)).toBe(false);
  });
});

describe('AI SDK adapter: Retry-After reaches the caller finite, for it to cap', () => {
  it.each([
    ['an HTTP date', new Date(NOW + 30_000).toUTCString(), 30_000],
    ['a date in the past', new Date(NOW - 60_000).toUTCString(), 0],
    ['a fraction of a second', '1.5', 1_500],
    ['a year', String(365 * 24 * 3600), 365 * 24 * 3600 * 1000],
    ['more seconds than any number can hold', '9'.repeat(400), Number.MAX_SAFE_INTEGER],
  ])('429 with Retry-After of %s', async (_label, header, expectedMs) => {
    const error = await failureOf(provider(failing(apiError(429, 'slow down', { 'retry-after': header }))).chat(request()));
    const retryAfterMs = (error as ProviderRateLimitedError).retryAfterMs;
    expect(retryAfterMs).toBe(expectedMs);
    expect(Number.isSafeInteger(retryAfterMs)).toBe(true);
  });

  it('a long Retry-After is capped by the engine like any server delay: an outage resumed at the cap', async () => {
    const error = await failureOf(provider(failing(apiError(503, 'down', { 'retry-after': String(7 * 24 * 3600) }))).chat(request()));
    expect(capServerDelay((error as ProviderUnavailableError).retryAfterMs, 900_000)).toEqual({ delayMs: 900_000, requestedMs: 7 * 24 * 3600 * 1000, capped: true });
  });

  it('an unreadable Retry-After is no hint at all', async () => {
    const error = await failureOf(provider(failing(apiError(429, 'slow down', { 'retry-after': 'soon' }))).chat(request()));
    expect(error).toMatchObject({ retryAfterMs: undefined });
  });
});

describe("AI SDK adapter: the step's abort signal and time limit", () => {
  it('passes the abort signal to the model: aborting the step aborts the request with the same reason', async () => {
    const controller = new AbortController();
    const reason = new Error('the step stopped');
    const model = stalling([start, ...text('partial').slice(0, 2)]);
    const error = await failureOf(provider(model).chat(request({ signal: controller.signal, onText: () => controller.abort(reason) })));
    expect(error).toBe(reason);
    const seen = model.doStreamCalls[0]!.abortSignal!;
    expect(seen.aborted).toBe(true);
    expect(seen.reason).toBe(reason);
  });

  it('an already aborted step asks the model nothing', async () => {
    const controller = new AbortController();
    const reason = new Error('already cancelled');
    controller.abort(reason);
    const model = streaming([start, ...text('never'), finish('stop', 'stop')]);
    expect(await failureOf(provider(model).chat(request({ signal: controller.signal })))).toBe(reason);
    expect(model.doStreamCalls).toHaveLength(0);
  });

  it("the caller's time limit ends a stalled stream as a timeout, billed what was streamed", async () => {
    const model = stalling([start, metadata, { type: 'text-start', id: 't0' }, { type: 'text-delta', id: 't0', delta: 'slow' }]);
    const error = await failureOf(provider(model, { timeoutMs: 60_000 }).chat(request({ timeoutMs: 50 })));
    expect(error).toBeInstanceOf(ProviderTimeoutError);
    expect((error as Error).message).toMatch(/no answer within 50 ms/);
    const inputTokens = estimatedInputTokens(question, []);
    expect((error as ProviderTimeoutError).billedUsd).toBeCloseTo((inputTokens / 1000) * 0.5 + (1 / 1000) * 2, 12);
  });
});

describe('AI SDK adapter: configuration', () => {
  it('refuses bad settings and string model IDs as invalid input', () => {
    expect(() => createAiSdkProvider({ model: streaming([]), ...settings, timeoutMs: 0 })).toThrow(TerminalError);
    expect(() => createAiSdkProvider({ model: streaming([]), ...settings, inputUsdPer1kTokens: -1 })).toThrow(/inputUsdPer1kTokens/);
    const stringModel = 'openai/gpt-4o' as unknown as MockLanguageModelV3;
    expect(() => createAiSdkProvider({ model: stringModel, ...settings })).toThrow(/language model object/);
  });
});
