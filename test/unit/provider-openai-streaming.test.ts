/**
 * The OpenAI-compatible provider's streaming path (asked for with `onText`) against a local HTTP
 * server that writes server-sent events the way Chat Completions streams: the request asks for a
 * stream with usage, the deltas (text and tool calls in pieces) become the same complete answer,
 * the caller sees the text grow, and a stream that breaks off is a retryable failure, never a
 * shorter answer.
 */
import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { MalformedResponseError, ProviderRateLimitedError, ProviderUnavailableError, type ChatMessage, type ChatRequest } from '../../functions/src/agent/provider';
import { ManualClock } from '../../functions/src/core/clock';
import { createOpenAiCompatibleProvider, type OpenAiCompatibleConfig } from '../../functions/src/providers/openai-compatible';
import { failureOf } from '../support/failures';

interface Received {
  readonly headers: IncomingHttpHeaders;
  readonly body: Record<string, unknown>;
}

const received: Received[] = [];
let respond: (response: ServerResponse) => void = (response) => {
  response.writeHead(500).end();
};
let server: Server;
let baseUrl = '';

beforeAll(async () => {
  server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      received.push({ headers: request.headers, body: JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown> });
      respond(response);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve, reject) => server.close((error) => (error === undefined ? resolve() : reject(error))));
});

beforeEach(() => {
  received.length = 0;
});

const config: OpenAiCompatibleConfig = {
  get baseUrl() {
    return baseUrl;
  },
  model: 'test-model',
  apiKey: 'sk-stream-test',
  timeoutMs: 5_000,
  contextWindowTokens: 8_192,
  inputUsdPer1kTokens: 0.5,
  outputUsdPer1kTokens: 2,
};

const question: readonly ChatMessage[] = [{ role: 'user', content: 'What is a lease?', promptId: 'p1' }];

function streamingRequest(drafts: string[], extra: Partial<ChatRequest> = {}): ChatRequest {
  return { messages: question, tools: [], signal: new AbortController().signal, onText: (text) => drafts.push(text), ...extra };
}

const provider = () => createOpenAiCompatibleProvider(config, { clock: new ManualClock(Date.UTC(2026, 4, 1)) });

const chunk = (delta: Record<string, unknown>, finishReason: string | null = null): Record<string, unknown> => ({
  id: 'chatcmpl-s',
  object: 'chat.completion.chunk',
  choices: [{ index: 0, delta, finish_reason: finishReason }],
});
const usageChunk = { id: 'chatcmpl-s', object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 1000, completion_tokens: 500 } };

/** The events as a Chat Completions stream writes them, `[DONE]` last unless left out. */
function eventStream(events: readonly unknown[], done = true): string {
  return events.map((event) => `data: ${JSON.stringify(event)}\n\n`).join('') + (done ? 'data: [DONE]\n\n' : '');
}

/** Writes `text` in pieces of `size` bytes, each its own write, so events are split anywhere. */
function streamInPieces(text: string, size: number, end = true): (response: ServerResponse) => void {
  return (response) => {
    response.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
    const bytes = Buffer.from(text, 'utf8');
    for (let at = 0; at < bytes.length; at += size) response.write(bytes.subarray(at, at + size));
    if (end) response.end();
    // Cut the connection once what was written has left, mid-answer, as a dying server does.
    else response.write('', () => response.destroy());
  };
}

describe('openai-compatible provider: streaming', () => {
  it('asks for a stream with usage, shows the text as it grows and returns the whole answer', async () => {
    respond = streamInPieces(
      eventStream([chunk({ role: 'assistant', content: '' }), chunk({ content: 'A lease ' }), chunk({ content: 'is a time-bound ' }), chunk({ content: 'claim.' }), chunk({}, 'stop'), usageChunk]),
      4096,
    );
    const drafts: string[] = [];
    const answer = await provider().chat(streamingRequest(drafts));

    expect(received[0]?.body).toMatchObject({ model: 'test-model', stream: true, stream_options: { include_usage: true } });
    expect(received[0]?.headers.accept).toBe('text/event-stream');
    expect(drafts).toEqual(['A lease ', 'A lease is a time-bound ', 'A lease is a time-bound claim.']);
    expect(answer).toEqual({
      message: { role: 'assistant', content: 'A lease is a time-bound claim.' },
      finishReason: 'stop',
      usage: { inputTokens: 1000, outputTokens: 500 },
      costUsd: 0.5 + 1,
    });
  });

  it('assembles tool calls streamed in pieces, two of them interleaved, events split at every byte', async () => {
    respond = streamInPieces(
      eventStream([
        chunk({ role: 'assistant', content: null, tool_calls: [{ index: 0, id: 'call_a', type: 'function', function: { name: 'search', arguments: '' } }] }),
        chunk({ tool_calls: [{ index: 1, id: 'call_b', type: 'function', function: { name: 'read', arguments: '{"id":' } }] }),
        chunk({ tool_calls: [{ index: 0, function: { arguments: '{"query":"fenc' } }] }),
        chunk({ tool_calls: [{ index: 1, function: { arguments: '"doc-7"}' } }] }),
        chunk({ tool_calls: [{ index: 0, function: { arguments: 'ing tokens"}' } }] }),
        chunk({}, 'tool_calls'),
        usageChunk,
      ]),
      1,
    );
    const drafts: string[] = [];
    const answer = await provider().chat(streamingRequest(drafts));

    expect(answer.finishReason).toBe('tool_calls');
    expect(answer.message).toEqual({
      role: 'assistant',
      content: null,
      toolCalls: [
        { id: 'call_a', name: 'search', arguments: '{"query":"fencing tokens"}' },
        { id: 'call_b', name: 'read', arguments: '{"id":"doc-7"}' },
      ],
    });
    expect(drafts).toEqual([]);
  });

  it('a stream that breaks off before the answer is finished fails as unavailable (retryable), with no answer', async () => {
    respond = streamInPieces(eventStream([chunk({ content: 'A lease is' }), chunk({ content: ' a time' })], false), 4096, false);
    const drafts: string[] = [];
    const error = await failureOf(provider().chat(streamingRequest(drafts)));
    expect(error).toBeInstanceOf(ProviderUnavailableError);
    // The draft was shown as it came; it is not an answer.
    expect(drafts.at(-1)).toBe('A lease is a time');
  });

  it('a stream that ends cleanly but without a finish reason is not an answer either', async () => {
    respond = streamInPieces(eventStream([chunk({ content: 'Half of it' })]), 4096);
    expect(await failureOf(provider().chat(streamingRequest([])))).toBeInstanceOf(ProviderUnavailableError);
  });

  it('an error event after the 200 is a retryable failure; an event that is not JSON is a malformed response', async () => {
    respond = streamInPieces(eventStream([chunk({ content: 'Begun' }), { error: { message: 'overloaded', type: 'server_error' } }]), 4096);
    const error = await failureOf(provider().chat(streamingRequest([])));
    expect(error).toBeInstanceOf(ProviderUnavailableError);
    expect((error as Error).message).toContain('overloaded');

    respond = streamInPieces(`data: ${JSON.stringify(chunk({ content: 'ok' }))}\n\ndata: {not json\n\n`, 4096);
    expect(await failureOf(provider().chat(streamingRequest([])))).toBeInstanceOf(MalformedResponseError);
  });

  it('a streamed tool call missing its ID is refused, not guessed', async () => {
    respond = streamInPieces(eventStream([chunk({ tool_calls: [{ index: 0, function: { name: 'search', arguments: '{}' } }] }), chunk({}, 'tool_calls')]), 4096);
    expect(await failureOf(provider().chat(streamingRequest([])))).toBeInstanceOf(MalformedResponseError);
  });

  it('a server that answers with one JSON body instead gives the same answer, with no draft', async () => {
    respond = (response) => {
      response.writeHead(200, { 'content-type': 'application/json' }).end(
        JSON.stringify({ choices: [{ index: 0, message: { role: 'assistant', content: 'Whole.' }, finish_reason: 'stop' }], usage: { prompt_tokens: 10, completion_tokens: 2 } }),
      );
    };
    const drafts: string[] = [];
    const answer = await provider().chat(streamingRequest(drafts));
    expect(answer.message).toEqual({ role: 'assistant', content: 'Whole.' });
    expect(drafts).toEqual([]);
  });

  it('an HTTP error before the stream is translated as without streaming', async () => {
    respond = (response) => {
      response.writeHead(429, { 'content-type': 'application/json', 'retry-after': '7' }).end(JSON.stringify({ error: { message: 'slow down' } }));
    };
    const error = await failureOf(provider().chat(streamingRequest([])));
    expect(error).toBeInstanceOf(ProviderRateLimitedError);
    expect((error as ProviderRateLimitedError).retryAfterMs).toBe(7_000);
  });

  it('a draft callback that throws costs nothing: the answer still arrives whole', async () => {
    respond = streamInPieces(eventStream([chunk({ content: 'Still ' }), chunk({ content: 'here.' }, 'stop')]), 4096);
    const answer = await provider().chat({
      messages: question,
      tools: [],
      signal: new AbortController().signal,
      onText: () => {
        throw new Error('the draft sink broke');
      },
    });
    expect(answer.message.content).toBe('Still here.');
  });

  it("the caller's abort mid-stream ends the call with the caller's reason", async () => {
    const controller = new AbortController();
    respond = (response) => {
      response.writeHead(200, { 'content-type': 'text/event-stream' });
      response.write(`data: ${JSON.stringify(chunk({ content: 'Started' }))}\n\n`);
      // Never finishes: only the abort ends the call.
    };
    const reason = new Error('claim lost');
    const call = provider().chat(streamingRequest([], { signal: controller.signal, onText: () => controller.abort(reason) }));
    expect(await failureOf(call)).toBe(reason);
  });

  it('without onText nothing streams', async () => {
    respond = (response) => {
      response.writeHead(200, { 'content-type': 'application/json' }).end(
        JSON.stringify({ choices: [{ index: 0, message: { role: 'assistant', content: 'Plain.' }, finish_reason: 'stop' }] }),
      );
    };
    await provider().chat({ messages: question, tools: [], signal: new AbortController().signal });
    expect(received[0]?.body['stream']).toBeUndefined();
    expect(received[0]?.headers.accept).toBe('application/json');
  });
});

describe('openai-compatible provider: streamed tool calls as different servers send them', () => {
  it('a name repeated whole in every delta is the name once', async () => {
    respond = streamInPieces(
      eventStream([
        chunk({ tool_calls: [{ index: 0, id: 'c1', type: 'function', function: { name: 'search', arguments: '' } }] }),
        chunk({ tool_calls: [{ index: 0, function: { name: 'search', arguments: '{"q":' } }] }),
        chunk({ tool_calls: [{ index: 0, function: { name: 'search', arguments: '"x"}' } }] }),
        chunk({}, 'tool_calls'),
      ]),
      4096,
    );
    expect((await provider().chat(streamingRequest([]))).message.toolCalls).toEqual([{ id: 'c1', name: 'search', arguments: '{"q":"x"}' }]);
  });

  it('a name sent in pieces is joined', async () => {
    respond = streamInPieces(
      eventStream([chunk({ tool_calls: [{ index: 0, id: 'c1', function: { name: 'fetch', arguments: '' } }] }), chunk({ tool_calls: [{ index: 0, function: { name: '_page', arguments: '{}' } }] }), chunk({}, 'tool_calls')]),
      4096,
    );
    expect((await provider().chat(streamingRequest([]))).message.toolCalls).toEqual([{ id: 'c1', name: 'fetch_page', arguments: '{}' }]);
  });

  it('calls without an index (as Gemini sends them) are told apart by their IDs', async () => {
    respond = streamInPieces(
      eventStream([
        chunk({ role: 'assistant', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{"q":"a"}' } }] }),
        chunk({ tool_calls: [{ id: 'c2', type: 'function', function: { name: 'read', arguments: '{"id":' } }] }),
        chunk({ tool_calls: [{ function: { arguments: '"d1"}' } }] }),
        chunk({}, 'stop'),
      ]),
      4096,
    );
    const answer = await provider().chat(streamingRequest([]));
    expect(answer.message.toolCalls).toEqual([
      { id: 'c1', name: 'search', arguments: '{"q":"a"}' },
      { id: 'c2', name: 'read', arguments: '{"id":"d1"}' },
    ]);
    expect(answer.finishReason).toBe('tool_calls');
  });

  it('an index far past the calls begun is refused, not dropped', async () => {
    respond = streamInPieces(
      eventStream([
        chunk({ tool_calls: [{ index: 0, id: 'c1', function: { name: 'search', arguments: '{}' } }] }),
        chunk({ tool_calls: [{ index: 4294967295, id: 'c2', function: { name: 'search', arguments: '{"q":"lost"}' } }] }),
        chunk({}, 'tool_calls'),
      ]),
      4096,
    );
    expect(await failureOf(provider().chat(streamingRequest([])))).toBeInstanceOf(MalformedResponseError);
  });
});
