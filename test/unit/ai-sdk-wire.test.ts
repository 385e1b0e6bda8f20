/**
 * The AI SDK adapter around a real `@ai-sdk/openai-compatible` model, against a local HTTP server
 * (node:http on 127.0.0.1, port 0) that streams Chat Completions the way OpenAI does: text and
 * tool-call deltas in pieces, usage last. What reaches the wire, what comes back through the port,
 * and that a 429 or a 500 is one request (the SDK's retries are off) translated to the port's class.
 */
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  ContextWindowError,
  MalformedResponseError,
  ProviderRateLimitedError,
  ProviderRequestError,
  ProviderUnavailableError,
  type BilledCall,
  type ChatMessage,
  type ChatRequest,
  type ToolSpec,
} from '../../functions/src/agent/provider';
import { ManualClock } from '../../functions/src/core/clock';
import { createAiSdkProvider } from '../../functions/src/providers/ai-sdk';
import { failureOf } from '../support/failures';

interface Received {
  readonly url: string | undefined;
  readonly headers: IncomingHttpHeaders;
  readonly body: Record<string, unknown>;
}

const API_KEY = 'sk-wire-test-0123';
const received: Received[] = [];
/** Settles when the server sees the client go away (a cut, an abort). */
let clientGone: Promise<void> = Promise.resolve();
let respond: (response: ServerResponse) => void = (response) => {
  response.writeHead(500).end();
};
let server: Server;
let baseURL = '';

beforeAll(async () => {
  server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      received.push({ url: request.url, headers: request.headers, body: JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown> });
      clientGone = new Promise((resolve) => response.on('close', () => resolve()));
      respond(response);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseURL = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve, reject) => server.close((error) => (error === undefined ? resolve() : reject(error))));
});

beforeEach(() => {
  received.length = 0;
});

const clock = new ManualClock(Date.UTC(2026, 4, 1));

function provider() {
  const local = createOpenAICompatible({ name: 'local', baseURL, apiKey: API_KEY, includeUsage: true });
  return createAiSdkProvider(
    { model: local.chatModel('test-model'), timeoutMs: 5_000, contextWindowTokens: 8_192, inputUsdPer1kTokens: 0.5, outputUsdPer1kTokens: 2 },
    { clock },
  );
}

const question: readonly ChatMessage[] = [
  { role: 'system', content: 'You research leases.' },
  { role: 'user', content: 'What is a lease?', promptId: 'p1' },
];

const searchTool: ToolSpec = {
  name: 'search',
  description: 'Searches the corpus',
  parameters: { type: 'object', properties: { query: { type: 'string' } }, required: ['query'] },
};

function request(extra: Partial<ChatRequest> = {}): ChatRequest {
  return { messages: question, tools: [], signal: new AbortController().signal, ...extra };
}

const chunk = (delta: Record<string, unknown>, finishReason: string | null = null): Record<string, unknown> => ({
  id: 'chatcmpl-w',
  object: 'chat.completion.chunk',
  created: 1_777_000_000,
  model: 'test-model',
  choices: [{ index: 0, delta, finish_reason: finishReason }],
});
const usageChunk = (prompt: number, completion: number) => ({
  id: 'chatcmpl-w',
  object: 'chat.completion.chunk',
  created: 1_777_000_000,
  model: 'test-model',
  choices: [],
  usage: { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion },
});

const event = (data: unknown): string => `data: ${JSON.stringify(data)}\n\n`;

function sendEvents(response: ServerResponse, events: readonly unknown[]): void {
  response.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  response.end(events.map(event).join('') + 'data: [DONE]\n\n');
}

function sendJson(response: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  response.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(body));
}

describe('AI SDK adapter over @ai-sdk/openai-compatible: streamed answers', () => {
  it('streams text deltas into drafts and returns the answer with the usage the stream reported', async () => {
    respond = (response) =>
      sendEvents(response, [
        chunk({ role: 'assistant', content: '' }),
        chunk({ content: 'A lease ' }),
        chunk({ content: 'is a claim ' }),
        chunk({ content: 'with an expiry.' }),
        chunk({}, 'stop'),
        usageChunk(1000, 500),
      ]);
    const drafts: string[] = [];
    const response = await provider().chat(request({ onText: (textSoFar) => drafts.push(textSoFar), maxOutputTokens: 300 }));
    expect(drafts).toEqual(['A lease ', 'A lease is a claim ', 'A lease is a claim with an expiry.']);
    expect(response).toEqual({
      message: { role: 'assistant', content: 'A lease is a claim with an expiry.' },
      finishReason: 'stop',
      usage: { inputTokens: 1000, outputTokens: 500 },
      costUsd: 1.5,
    });
    expect(received).toHaveLength(1);
    const [wire] = received;
    expect(wire!.url).toBe('/v1/chat/completions');
    expect(wire!.headers['authorization']).toBe(`Bearer ${API_KEY}`);
    expect(wire!.body).toMatchObject({
      model: 'test-model',
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: 300,
      messages: [
        { role: 'system', content: 'You research leases.' },
        { role: 'user', content: 'What is a lease?' },
      ],
    });
    expect(wire!.body['tools']).toBeUndefined();
  });

  it('assembles tool calls streamed in pieces, arguments exactly as written', async () => {
    respond = (response) =>
      sendEvents(response, [
        chunk({ role: 'assistant', content: null, tool_calls: [{ index: 0, id: 'call_a', type: 'function', function: { name: 'search', arguments: '' } }] }),
        chunk({ tool_calls: [{ index: 0, function: { arguments: '{"query": ' } }] }),
        chunk({ tool_calls: [{ index: 0, function: { arguments: '"lease expiry"}' } }] }),
        chunk({ tool_calls: [{ index: 1, id: 'call_b', type: 'function', function: { name: 'search', arguments: '{"query":' } }] }),
        chunk({ tool_calls: [{ index: 1, function: { arguments: '"fencing"}' } }] }),
        chunk({}, 'tool_calls'),
        usageChunk(1200, 40),
      ]);
    const response = await provider().chat(request({ tools: [searchTool], onText: () => undefined }));
    expect(response).toEqual({
      message: {
        role: 'assistant',
        content: null,
        toolCalls: [
          { id: 'call_a', name: 'search', arguments: '{"query": "lease expiry"}' },
          { id: 'call_b', name: 'search', arguments: '{"query":"fencing"}' },
        ],
      },
      finishReason: 'tool_calls',
      usage: { inputTokens: 1200, outputTokens: 40 },
      costUsd: (1200 / 1000) * 0.5 + (40 / 1000) * 2,
    });
    expect(received[0]!.body['tools']).toEqual([
      { type: 'function', function: { name: 'search', description: 'Searches the corpus', parameters: searchTool.parameters } },
    ]);
  });

  it('sends a transcript with tool calls and their results in the Chat Completions wire format', async () => {
    respond = (response) => sendEvents(response, [chunk({ content: 'Leases expire.' }), chunk({}, 'stop'), usageChunk(90, 3)]);
    const transcript: ChatMessage[] = [
      ...question,
      { role: 'assistant', content: null, toolCalls: [{ id: 'call_a', name: 'search', arguments: '{"query":"lease"}' }] },
      { role: 'tool', toolCallId: 'call_a', name: 'search', content: '[1] A lease is a claim that expires.' },
    ];
    const response = await provider().chat(request({ messages: transcript, tools: [searchTool] }));
    expect(response.message.content).toBe('Leases expire.');
    const messages = received[0]!.body['messages'] as Record<string, unknown>[];
    expect(messages.slice(2)).toEqual([
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_a', type: 'function', function: { name: 'search', arguments: '{"query":"lease"}' } }] },
      { role: 'tool', tool_call_id: 'call_a', content: '[1] A lease is a claim that expires.' },
    ]);
  });

  it('an error event inside the stream is an unavailable provider', async () => {
    respond = (response) => sendEvents(response, [chunk({ content: 'Part' }), { error: { message: 'upstream overloaded', type: 'server_error', code: 'overloaded' } }]);
    const error = await failureOf(provider().chat(request({ onText: () => undefined })));
    expect(error).toBeInstanceOf(ProviderUnavailableError);
    expect((error as Error).message).toContain('upstream overloaded');
    expect((error as ProviderUnavailableError).billedUsd).toBeGreaterThan(0);
  });

  it('a streamed event that is not a chat completion chunk is malformed', async () => {
    respond = (response) => sendEvents(response, [chunk({ content: 'Part' }), { choices: 'not a list' }]);
    const error = await failureOf(provider().chat(request({ onText: () => undefined })));
    expect(error).toBeInstanceOf(MalformedResponseError);
    expect(error).toMatchObject({ code: 'malformed_response', retryable: true });
  });
});

describe('AI SDK adapter over @ai-sdk/openai-compatible: failures, each one request', () => {
  it('429 with Retry-After is rate limited with the delay, asked once', async () => {
    respond = (response) => sendJson(response, 429, { error: { message: 'Rate limit reached', type: 'requests', code: 'rate_limit_exceeded' } }, { 'retry-after': '7' });
    const error = await failureOf(provider().chat(request()));
    expect(error).toBeInstanceOf(ProviderRateLimitedError);
    expect(error).toMatchObject({ code: 'rate_limited', retryable: true, retryAfterMs: 7_000, billedUsd: undefined });
    expect((error as Error).message).toContain('HTTP 429: Rate limit reached');
    expect(received).toHaveLength(1);
  });

  it('500 is unavailable, asked once', async () => {
    respond = (response) => sendJson(response, 500, { error: { message: 'The server had an error' } });
    const error = await failureOf(provider().chat(request()));
    expect(error).toBeInstanceOf(ProviderUnavailableError);
    expect(error).toMatchObject({ code: 'provider_unavailable', retryable: true, retryAfterMs: undefined });
    expect(received).toHaveLength(1);
  });

  it('400 context_length_exceeded is a context window error', async () => {
    respond = (response) =>
      sendJson(response, 400, { error: { message: "This model's maximum context length is 8192 tokens.", type: 'invalid_request_error', code: 'context_length_exceeded' } });
    const error = await failureOf(provider().chat(request()));
    expect(error).toBeInstanceOf(ContextWindowError);
    expect(received).toHaveLength(1);
  });

  it('401 is a rejected request', async () => {
    respond = (response) => sendJson(response, 401, { error: { message: 'Incorrect API key provided', code: 'invalid_api_key' } });
    const error = await failureOf(provider().chat(request()));
    expect(error).toBeInstanceOf(ProviderRequestError);
    expect(error).toMatchObject({ retryable: false });
  });

  it('a stream cut off midway is unavailable, billed what was streamed', async () => {
    respond = (response) => {
      response.writeHead(200, { 'content-type': 'text/event-stream' });
      // 'Twelve chars' is 3 tokens at four characters a token; the connection then drops.
      response.write(event(chunk({ content: 'Twelve chars' })), () => response.destroy());
    };
    const error = await failureOf(provider().chat(request({ onText: () => undefined })));
    expect(error).toBeInstanceOf(ProviderUnavailableError);
    const inputTokens = Math.ceil(JSON.stringify({ messages: question, tools: [] }).length / 4);
    expect((error as ProviderUnavailableError).billedUsd).toBeCloseTo((inputTokens / 1000) * 0.5 + (3 / 1000) * 2, 12);
  });

  it("aborting the step mid-stream closes the connection and bills what was streamed inside the abort", async () => {
    const controller = new AbortController();
    const reason = new Error('cancelled by its owner');
    const billed: BilledCall[] = [];
    respond = (response) => {
      response.writeHead(200, { 'content-type': 'text/event-stream' });
      // The answer begins and then stalls: only the abort ends it.
      response.write(event(chunk({ content: 'Sixteen chars!!!' })));
    };
    const error = await failureOf(
      provider().chat(request({ signal: controller.signal, onText: () => controller.abort(reason), onBilledAfterAbort: (call) => billed.push(call) })),
    );
    expect(error).toBe(reason);
    const inputTokens = Math.ceil(JSON.stringify({ messages: question, tools: [] }).length / 4);
    expect(billed).toEqual([{ usage: { inputTokens, outputTokens: 4 }, costUsd: (inputTokens / 1000) * 0.5 + (4 / 1000) * 2 }]);
    // The server sees the request go: the abort reached the socket, not just the adapter.
    await clientGone;
  });
});
