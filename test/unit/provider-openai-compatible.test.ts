/**
 * The OpenAI-compatible provider against a local HTTP server (node:http on 127.0.0.1, port 0):
 * the exact wire request, the mapping back to the port, and the translation of every failure into
 * the port's error classes. The only real waits are the timeout cases (200 ms).
 */
import { createServer, type IncomingHttpHeaders, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  ContextWindowError,
  MalformedResponseError,
  ProviderRateLimitedError,
  ProviderRequestError,
  ProviderTimeoutError,
  ProviderUnavailableError,
  type ChatMessage,
  type ChatRequest,
  type ToolSpec,
} from '../../functions/src/agent/provider';
import { ManualClock } from '../../functions/src/core/clock';
import { TerminalError } from '../../functions/src/core/errors';
import { createOpenAiCompatibleProvider, type OpenAiCompatibleConfig } from '../../functions/src/providers/openai-compatible';
import { failureOf } from '../support/failures';

interface Received {
  readonly method: string | undefined;
  readonly url: string | undefined;
  readonly headers: IncomingHttpHeaders;
  readonly body: string;
}

type Handler = (request: IncomingMessage, response: ServerResponse) => void;

const API_KEY = 'sk-test-0123456789';
const received: Received[] = [];
const delayed = new Set<NodeJS.Timeout>();
let handler: Handler = (_request, response) => {
  response.writeHead(500).end();
};
let onReceived: (() => void) | undefined;
let server: Server;
let baseUrl = '';

function sendJson(response: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  response.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(body));
}

/** Answers after `ms` unless the client has gone; the timer is cleared when the connection closes. */
function sendLater(response: ServerResponse, ms: number, status: number, body: unknown): void {
  const timer = setTimeout(() => {
    delayed.delete(timer);
    if (!response.destroyed) sendJson(response, status, body);
  }, ms);
  delayed.add(timer);
  response.on('close', () => {
    clearTimeout(timer);
    delayed.delete(timer);
  });
}

beforeAll(async () => {
  server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      received.push({ method: request.method, url: request.url, headers: request.headers, body: Buffer.concat(chunks).toString('utf8') });
      onReceived?.();
      handler(request, response);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/`;
});

afterAll(async () => {
  for (const timer of delayed) clearTimeout(timer);
  server.closeAllConnections();
  await new Promise<void>((resolve, reject) => server.close((error) => (error === undefined ? resolve() : reject(error))));
  expect(server.listening).toBe(false);
});

beforeEach(() => {
  received.length = 0;
  onReceived = undefined;
});

const clock = new ManualClock(Date.UTC(2026, 4, 1, 12, 0, 0));

function config(overrides: Partial<OpenAiCompatibleConfig> = {}): OpenAiCompatibleConfig {
  return {
    baseUrl,
    model: 'test-model',
    apiKey: API_KEY,
    timeoutMs: 5_000,
    contextWindowTokens: 8_192,
    inputUsdPer1kTokens: 0.5,
    outputUsdPer1kTokens: 2,
    ...overrides,
  };
}

const searchSpec: ToolSpec = {
  name: 'search',
  description: 'Search the corpus.',
  parameters: { type: 'object', properties: { query: { type: 'string' } }, required: ['query'] },
};

function request(messages: readonly ChatMessage[], extra: Partial<ChatRequest> = {}): ChatRequest {
  return { messages, tools: [], signal: new AbortController().signal, ...extra };
}

const question: readonly ChatMessage[] = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'What is a lease?', promptId: 'p1' },
];

function completion(message: Record<string, unknown>, finishReason: string, usage = { prompt_tokens: 1000, completion_tokens: 500 }): unknown {
  return { id: 'chatcmpl-1', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', ...message }, finish_reason: finishReason }], usage };
}

describe('openai-compatible provider: wire format', () => {
  it('sends tool calls and tool results in the wire format and maps tool calls back', async () => {
    handler = (_request, response) => {
      sendJson(
        response,
        200,
        completion(
          {
            content: null,
            tool_calls: [
              { id: 'call_b', type: 'function', function: { name: 'search', arguments: '{"query":"fencing"}' } },
              { id: 'call_c', type: 'function', function: { name: 'search', arguments: '{"query":"leases"}' } },
            ],
          },
          'tool_calls',
        ),
      );
    };
    const provider = createOpenAiCompatibleProvider(config(), { clock });
    const messages: ChatMessage[] = [
      ...question,
      { role: 'assistant', content: null, toolCalls: [{ id: 'call_a', name: 'search', arguments: '{"query":"lease"}' }] },
      { role: 'tool', toolCallId: 'call_a', name: 'search', content: '{"results":[]}' },
      { role: 'assistant', content: 'Nothing yet.' },
      { role: 'user', content: 'Try again.' },
    ];
    const response = await provider.chat(request(messages, { tools: [searchSpec], maxOutputTokens: 256 }));

    expect(received).toHaveLength(1);
    const sent = received[0]!;
    expect(sent.method).toBe('POST');
    expect(sent.url).toBe('/v1/chat/completions');
    expect(sent.headers.authorization).toBe(`Bearer ${API_KEY}`);
    expect(sent.headers['content-type']).toBe('application/json');
    expect(JSON.parse(sent.body)).toEqual({
      model: 'test-model',
      messages: [
        { role: 'system', content: 'You are terse.' },
        { role: 'user', content: 'What is a lease?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_a', type: 'function', function: { name: 'search', arguments: '{"query":"lease"}' } }] },
        { role: 'tool', tool_call_id: 'call_a', content: '{"results":[]}' },
        { role: 'assistant', content: 'Nothing yet.' },
        { role: 'user', content: 'Try again.' },
      ],
      tools: [{ type: 'function', function: { name: 'search', description: 'Search the corpus.', parameters: searchSpec.parameters } }],
      max_tokens: 256,
    });

    expect(response).toEqual({
      message: {
        role: 'assistant',
        content: null,
        toolCalls: [
          { id: 'call_b', name: 'search', arguments: '{"query":"fencing"}' },
          { id: 'call_c', name: 'search', arguments: '{"query":"leases"}' },
        ],
      },
      finishReason: 'tool_calls',
      usage: { inputTokens: 1000, outputTokens: 500 },
      costUsd: 1000 / 1000 * 0.5 + 500 / 1000 * 2,
    });
    expect(provider.name).toBe('openai-compatible:test-model');
    expect(provider.contextWindowTokens).toBe(8_192);
  });

  it('maps a final text answer; no key means no Authorization header and no tools field', async () => {
    handler = (_request, response) => {
      sendJson(response, 200, completion({ content: 'A lease is a lock with an expiry.' }, 'stop', { prompt_tokens: 20, completion_tokens: 9 }));
    };
    const { apiKey: _omitted, ...withoutKey } = config();
    const provider = createOpenAiCompatibleProvider(withoutKey, { clock });
    const response = await provider.chat(request(question));

    expect(received[0]!.headers.authorization).toBeUndefined();
    expect(JSON.parse(received[0]!.body)).toEqual({
      model: 'test-model',
      messages: [
        { role: 'system', content: 'You are terse.' },
        { role: 'user', content: 'What is a lease?' },
      ],
    });
    expect(response.message).toEqual({ role: 'assistant', content: 'A lease is a lock with an expiry.' });
    expect(response.finishReason).toBe('stop');
    expect(response.usage).toEqual({ inputTokens: 20, outputTokens: 9 });
    expect(response.costUsd).toBeCloseTo(0.02 * 0.5 + 0.009 * 2, 10);
  });

  it('maps finish_reason length, and estimates usage when the server omits it', async () => {
    handler = (_request, response) => {
      sendJson(response, 200, { choices: [{ message: { role: 'assistant', content: 'A lease is a lo' }, finish_reason: 'length' }] });
    };
    const provider = createOpenAiCompatibleProvider(config(), { clock });
    const response = await provider.chat(request(question, { maxOutputTokens: 4 }));
    expect(response.finishReason).toBe('length');
    expect(response.usage.inputTokens).toBe(Math.ceil(received[0]!.body.length / 4));
    expect(response.usage.outputTokens).toBe(Math.ceil('A lease is a lo'.length / 4));
  });
});

describe('openai-compatible provider: failures become the port error classes', () => {
  it('429 with Retry-After in seconds gives ProviderRateLimitedError with retryAfterMs', async () => {
    handler = (_request, response) => {
      sendJson(response, 429, { error: { message: 'Rate limit reached', code: 'rate_limit_exceeded' } }, { 'retry-after': '7' });
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(ProviderRateLimitedError);
    expect(error).toMatchObject({ retryAfterMs: 7_000, retryable: true, code: 'rate_limited' });
  });

  it('429 with Retry-After as an HTTP date gives the time until that date on the injected clock', async () => {
    handler = (_request, response) => {
      sendJson(response, 429, { error: { message: 'slow down' } }, { 'retry-after': new Date(clock.now() + 30_000).toUTCString() });
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(ProviderRateLimitedError);
    expect(error).toMatchObject({ retryAfterMs: 30_000 });
  });

  it('429 without Retry-After has no hint', async () => {
    handler = (_request, response) => {
      sendJson(response, 429, { error: { message: 'slow down' } });
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(ProviderRateLimitedError);
    expect(error).toMatchObject({ retryAfterMs: undefined });
  });

  it.each([500, 502, 503])('%i gives ProviderUnavailableError', async (status) => {
    handler = (_request, response) => {
      sendJson(response, status, { error: { message: 'upstream trouble' } }, status === 503 ? { 'retry-after': '2' } : {});
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(ProviderUnavailableError);
    expect(error).toMatchObject({ code: 'provider_unavailable', retryable: true, retryAfterMs: status === 503 ? 2_000 : undefined });
    expect((error as Error).message).toContain(`HTTP ${status}: upstream trouble`);
  });

  it('a dropped connection gives ProviderUnavailableError', async () => {
    handler = (request) => {
      request.socket.destroy();
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(ProviderUnavailableError);
  });

  it('no answer within timeoutMs gives ProviderTimeoutError', async () => {
    handler = (_request, response) => {
      sendLater(response, 1_000, 200, completion({ content: 'too late' }, 'stop'));
    };
    const startedAt = Date.now();
    const error = await failureOf(createOpenAiCompatibleProvider(config({ timeoutMs: 200 }), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(ProviderTimeoutError);
    expect(error).toMatchObject({ code: 'timeout', retryable: true });
    expect(Date.now() - startedAt).toBeLessThan(900);
  });

  it("bug 11: the caller's timeoutMs (what is left of its step) bounds the request when shorter than the configured timeout", async () => {
    handler = (_request, response) => {
      sendLater(response, 1_000, 200, completion({ content: 'too late' }, 'stop'));
    };
    const startedAt = Date.now();
    const error = await failureOf(createOpenAiCompatibleProvider(config({ timeoutMs: 60_000 }), { clock }).chat(request(question, { timeoutMs: 200 })));
    expect(error).toBeInstanceOf(ProviderTimeoutError);
    expect((error as Error).message).toContain('no answer within 200 ms');
    expect(Date.now() - startedAt).toBeLessThan(900);
  });

  it("the caller's abort is rethrown as the abort, not as a provider error", async () => {
    handler = (_request, response) => {
      sendLater(response, 1_000, 200, completion({ content: 'too late' }, 'stop'));
    };
    const controller = new AbortController();
    const reason = new Error('claim lost');
    onReceived = () => {
      controller.abort(reason);
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question, { signal: controller.signal })));
    expect(error).toBe(reason);
    expect(received).toHaveLength(1);
  });

  it('an already aborted signal sends nothing', async () => {
    const controller = new AbortController();
    const reason = new Error('cancelled');
    controller.abort(reason);
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question, { signal: controller.signal })));
    expect(error).toBe(reason);
    expect(received).toHaveLength(0);
  });

  it('a 200 body that is not JSON gives MalformedResponseError', async () => {
    handler = (_request, response) => {
      response.writeHead(200, { 'content-type': 'application/json' }).end('{"choices": [');
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(MalformedResponseError);
    expect(error).toMatchObject({ code: 'malformed_response', retryable: true });
  });

  it('a 200 body without choices gives MalformedResponseError', async () => {
    handler = (_request, response) => {
      sendJson(response, 200, { id: 'x', usage: { prompt_tokens: 1, completion_tokens: 1 } });
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(MalformedResponseError);
    expect((error as Error).message).toContain('choices');
  });

  it('a message with neither content nor tool calls gives MalformedResponseError', async () => {
    handler = (_request, response) => {
      sendJson(response, 200, completion({ content: null }, 'stop'));
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(MalformedResponseError);
  });

  it('400 saying the context length is exceeded gives ContextWindowError (by code or by message)', async () => {
    const provider = createOpenAiCompatibleProvider(config(), { clock });
    handler = (_request, response) => {
      sendJson(response, 400, { error: { message: 'Too long.', type: 'invalid_request_error', code: 'context_length_exceeded' } });
    };
    const byCode = await failureOf(provider.chat(request(question)));
    expect(byCode).toBeInstanceOf(ContextWindowError);
    expect(byCode).toMatchObject({ code: 'context_window', retryable: false });

    handler = (_request, response) => {
      sendJson(response, 400, { error: { message: "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens." } });
    };
    expect(await failureOf(provider.chat(request(question)))).toBeInstanceOf(ContextWindowError);
  });

  it('any other 400 gives ProviderRequestError', async () => {
    handler = (_request, response) => {
      sendJson(response, 400, { error: { message: "Invalid value for 'tools'", code: 'invalid_value' } });
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(ProviderRequestError);
    expect(error).not.toBeInstanceOf(ContextWindowError);
  });

  it.each([401, 403, 404, 422])('%i gives ProviderRequestError, and the key never appears in the error', async (status) => {
    handler = (_request, response) => {
      sendJson(response, status, { error: { message: `Incorrect API key provided: ${API_KEY}.`, code: 'invalid_api_key' } });
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(ProviderRequestError);
    expect(error).toMatchObject({ code: 'provider_rejected', retryable: false });
    expect((error as Error).message).toContain(`HTTP ${status}`);
    expect((error as Error).message).toContain('[redacted]');
    expect((error as Error).message).not.toContain(API_KEY);
  });
});

describe('openai-compatible provider: config and helpers', () => {
  it('rejects a bad config without echoing the key', () => {
    let thrown: unknown;
    try {
      createOpenAiCompatibleProvider(config({ baseUrl: 'not a url', timeoutMs: 0 }));
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(TerminalError);
    expect((thrown as Error).message).toMatch(/baseUrl/);
    expect((thrown as Error).message).toMatch(/timeoutMs/);
    expect((thrown as Error).message).not.toContain(API_KEY);
  });

});

describe('bug 4: a Retry-After far in the future reaches the caller as a finite delay, for it to cap', () => {
  // What the server asked for is reported as it is (a finite, safe number of milliseconds): the
  // caller caps it with the engine's maxServerDelayMs and treats anything longer as an outage.
  it.each([
    ['86400 seconds (a day)', '86400', 86_400_000],
    ['an HTTP date in 2100', 'Fri, 01 Jan 2100 00:00:00 GMT', Date.UTC(2100, 0, 1) - clock.now()],
    ['10^15 ms (10^12 seconds)', '1000000000000', 1e15],
    ['a fraction of a second', ' 1.5 ', 1_500],
    ['a date in the past', 'Thu, 01 Jan 2026 00:00:00 GMT', 0],
  ])('bug 4: 429 with Retry-After of %s', async (_label, header, expectedMs) => {
    handler = (_request, response) => {
      sendJson(response, 429, { error: { message: 'slow down' } }, { 'retry-after': header });
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(ProviderRateLimitedError);
    const retryAfterMs = (error as ProviderRateLimitedError).retryAfterMs;
    expect(retryAfterMs).toBe(expectedMs);
    expect(Number.isSafeInteger(retryAfterMs)).toBe(true);
  });

  it('bug 4: an unreadable Retry-After is no hint at all', async () => {
    handler = (_request, response) => {
      sendJson(response, 503, { error: { message: 'down' } }, { 'retry-after': 'soon' });
    };
    const error = await failureOf(createOpenAiCompatibleProvider(config(), { clock }).chat(request(question)));
    expect(error).toBeInstanceOf(ProviderUnavailableError);
    expect(error).toMatchObject({ retryAfterMs: undefined });
  });
});
