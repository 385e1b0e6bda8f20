/**
 * A model provider for any OpenAI-compatible Chat Completions endpoint (OpenAI, and the many
 * servers that copy its wire format), over the global `fetch`. It maps the port's messages to the
 * wire format and back, validates every response body with zod, and translates every failure into
 * the port's error classes, so no caller ever matches on an HTTP status or a message string.
 *
 * The API key goes in the Authorization header and nowhere else: it is never logged, and any
 * error text that happens to echo it is redacted.
 *
 * When the caller asks for the text as it is written (`onText`), the request streams
 * (server-sent events, parsed by eventsource-parser: our transport, error translation and
 * validation stay ours, where the official client would bring its own retries and types). The
 * deltas are assembled into the same complete answer; a stream that ends before the answer is
 * finished is an unavailable provider, never a shorter answer.
 */
import { createParser } from 'eventsource-parser';
import { z } from 'zod';
import {
  MalformedResponseError,
  providerErrorForStatus,
  ProviderRequestError,
  ProviderTimeoutError,
  ProviderUnavailableError,
  type ChatMessage,
  type ChatRequest,
  type ChatResponse,
  type ModelProvider,
  type ToolCall,
  type ToolSpec,
} from '../agent/provider';
import { systemClock, type Clock } from '../core/clock';
import { TerminalError } from '../core/errors';
import { parseRetryAfter } from '../core/server-delay';

export const openAiCompatibleConfigSchema = z.strictObject({
  /** e.g. `https://api.openai.com/v1`; `/chat/completions` is appended. */
  baseUrl: z.url({ protocol: /^https?$/ }),
  model: z.string().trim().min(1),
  apiKey: z.string().min(1).optional(),
  timeoutMs: z.int().min(1).max(3_600_000),
  contextWindowTokens: z.int().min(1),
  inputUsdPer1kTokens: z.number().min(0),
  outputUsdPer1kTokens: z.number().min(0),
});

/** An OpenAI-compatible Chat Completions endpoint: URL, model, key, timeouts and prices. */
export type OpenAiCompatibleConfig = Readonly<z.output<typeof openAiCompatibleConfigSchema>>;

export interface OpenAiCompatibleDependencies {
  /** Resolves `Retry-After` dates; defaults to the system clock. */
  readonly clock?: Clock;
  /** Defaults to the global `fetch`. */
  readonly fetch?: typeof fetch;
}

/** The longest provider error text carried into an error message. */
const MAX_ERROR_DETAIL_CHARS = 300;

const wireToolCallSchema = z.looseObject({
  id: z.string().min(1),
  type: z.literal('function').optional(),
  function: z.looseObject({ name: z.string().min(1), arguments: z.string() }),
});

const completionSchema = z.looseObject({
  choices: z
    .array(
      z.looseObject({
        message: z.looseObject({
          role: z.literal('assistant').optional(),
          content: z.string().nullish(),
          tool_calls: z.array(wireToolCallSchema).nullish(),
        }),
        finish_reason: z.string().nullish(),
      }),
    )
    .min(1),
  usage: z
    .looseObject({
      prompt_tokens: z.int().min(0),
      completion_tokens: z.int().min(0),
    })
    .nullish(),
});

const streamChunkSchema = z.looseObject({
  choices: z
    .array(
      z.looseObject({
        delta: z
          .looseObject({
            content: z.string().nullish(),
            tool_calls: z
              .array(
                z.looseObject({
                  // Some compatible servers (Gemini's) leave it out: then a call with an ID starts the next one.
                  index: z.int().min(0).optional(),
                  id: z.string().nullish(),
                  function: z.looseObject({ name: z.string().nullish(), arguments: z.string().nullish() }).nullish(),
                }),
              )
              .nullish(),
          })
          .nullish(),
        finish_reason: z.string().nullish(),
      }),
    )
    .nullish(),
  usage: z.looseObject({ prompt_tokens: z.int().min(0), completion_tokens: z.int().min(0) }).nullish(),
  error: z.unknown().optional(),
});

/** The answer as far as the stream has delivered it. */
interface StreamedAnswer {
  content: string | null;
  readonly toolCalls: { id: string; name: string; arguments: string }[];
  finishReason: string | null;
  usage: { prompt_tokens: number; completion_tokens: number } | null;
  done: boolean;
}

const errorBodySchema = z.looseObject({
  error: z.union([
    z.looseObject({
      message: z.string().nullish(),
      code: z.union([z.string(), z.number()]).nullish(),
      type: z.string().nullish(),
    }),
    z.string(),
  ]),
});

type WireMessage =
  | { role: 'system' | 'user'; content: string }
  | { role: 'assistant'; content: string | null; tool_calls?: { id: string; type: 'function'; function: { name: string; arguments: string } }[] }
  | { role: 'tool'; tool_call_id: string; content: string };

/** The port's messages in the Chat Completions wire format. */
export function toWireMessages(messages: readonly ChatMessage[]): WireMessage[] {
  return messages.map((message): WireMessage => {
    switch (message.role) {
      case 'system':
        return { role: 'system', content: message.content };
      case 'user':
        return { role: 'user', content: message.content };
      case 'assistant':
        return message.toolCalls === undefined || message.toolCalls.length === 0
          ? { role: 'assistant', content: message.content }
          : {
              role: 'assistant',
              content: message.content,
              tool_calls: message.toolCalls.map((call) => ({ id: call.id, type: 'function', function: { name: call.name, arguments: call.arguments } })),
            };
      case 'tool':
        return { role: 'tool', tool_call_id: message.toolCallId, content: message.content };
    }
  });
}

export function toWireTools(tools: readonly ToolSpec[]): { type: 'function'; function: { name: string; description: string; parameters: Readonly<Record<string, unknown>> } }[] {
  return tools.map((tool) => ({ type: 'function', function: { name: tool.name, description: tool.description, parameters: tool.parameters } }));
}

/** Whether a provider's 400 says the request does not fit the context window (by its error code, else its message). */
export function isContextLengthError(code: string | undefined, message: string): boolean {
  if (code !== undefined && /context_length|context_window|too_many_tokens/i.test(code)) return true;
  return /context (length|window)|maximum context|too many tokens|prompt is too long|reduce the length of the messages/i.test(message);
}

function finishReasonOf(reason: string | null | undefined, hasToolCalls: boolean): ChatResponse['finishReason'] {
  if (hasToolCalls) return 'tool_calls';
  return reason === 'length' ? 'length' : 'stop';
}

class OpenAiCompatibleProvider implements ModelProvider {
  readonly name: string;
  readonly contextWindowTokens: number;
  private readonly url: string;

  constructor(
    private readonly config: OpenAiCompatibleConfig,
    private readonly clock: Clock,
    private readonly fetchImpl: typeof fetch,
  ) {
    this.name = `openai-compatible:${config.model}`;
    this.contextWindowTokens = config.contextWindowTokens;
    this.url = `${config.baseUrl.replace(/\/+$/, '')}/chat/completions`;
  }

  async chat(request: ChatRequest): Promise<ChatResponse> {
    request.signal.throwIfAborted();
    const body: Record<string, unknown> = { model: this.config.model, messages: toWireMessages(request.messages) };
    // An empty `tools` array is rejected by OpenAI itself: leave the field out instead.
    if (request.tools.length > 0) body['tools'] = toWireTools(request.tools);
    if (request.maxOutputTokens !== undefined) body['max_tokens'] = request.maxOutputTokens;
    const streaming = request.onText !== undefined;
    if (streaming) {
      body['stream'] = true;
      // Without it a stream carries no token counts; servers that do not know the option ignore it.
      body['stream_options'] = { include_usage: true };
    }
    const headers: Record<string, string> = { 'content-type': 'application/json', accept: streaming ? 'text/event-stream' : 'application/json' };
    if (this.config.apiKey !== undefined) headers['authorization'] = `Bearer ${this.config.apiKey}`;

    const bodyText = JSON.stringify(body);
    // The caller's limit (what is left of its step) may be shorter than ours; the shorter one wins.
    const callerLimitMs = request.timeoutMs !== undefined && request.timeoutMs >= 0 ? request.timeoutMs : Number.POSITIVE_INFINITY;
    const timeoutMs = Math.max(1, Math.floor(Math.min(this.config.timeoutMs, callerLimitMs)));
    const timeout = AbortSignal.timeout(timeoutMs);
    const signal = AbortSignal.any([request.signal, timeout]);
    /** What the provider bills for this call so far, once it began to answer (null before): usage if reported, else estimated from what arrived. */
    let billedSoFar: (() => number) | null = null;
    const failed = (error: unknown): Error => {
      // The caller's abort wins: it is theirs to interpret (cancellation, lost claim), not a provider fault.
      if (request.signal.aborted) return request.signal.reason as Error;
      const billed = billedSoFar === null ? {} : { billedUsd: billedSoFar() };
      if (timeout.aborted) return new ProviderTimeoutError(`${this.name}: no answer within ${timeoutMs} ms`, { cause: error, ...billed });
      return new ProviderUnavailableError(`${this.name}: request failed: ${this.redact(error instanceof Error ? error.message : String(error))}`, { cause: error, ...billed });
    };
    let response: Response;
    try {
      response = await this.fetchImpl(this.url, { method: 'POST', headers, body: bodyText, signal });
    } catch (error) {
      throw failed(error);
    }
    if (response.status < 200 || response.status >= 300) {
      let text: string;
      try {
        text = await response.text();
      } catch (error) {
        throw failed(error);
      }
      throw this.httpError(response.status, response.headers, text);
    }
    // The provider began to answer: from here a cut-off call is billed what it had done (the prompt, and what was streamed).
    const answer: StreamedAnswer = { content: null, toolCalls: [], finishReason: null, usage: null, done: false };
    billedSoFar = () => this.cost(answer.usage, bodyText.length, answer.content, answer.toolCalls).costUsd;
    const billedAfterAbort = this.reportBilledAfterAbort(request, answer, bodyText.length);
    try {
      const isEventStream = (response.headers.get('content-type') ?? '').toLowerCase().startsWith('text/event-stream');
      let completion: ChatResponse;
      if (request.onText !== undefined && isEventStream && response.body !== null) {
        try {
          await this.readStream(response.body, request.onText, answer, billedSoFar);
        } catch (error) {
          throw error instanceof MalformedResponseError || error instanceof ProviderUnavailableError ? error : failed(error);
        }
        completion = this.streamedCompletion(answer, bodyText.length);
      } else {
        let text: string;
        try {
          text = await response.text();
        } catch (error) {
          throw failed(error);
        }
        // A server that does not stream answers with one JSON body: the same answer, with no draft shown.
        completion = this.parseCompletion(text, bodyText.length);
      }
      // Aborted as it finished: the caller was told the cost already, so it hears the abort, not the answer.
      if (billedAfterAbort.reported()) throw request.signal.reason as Error;
      return completion;
    } finally {
      billedAfterAbort.stop();
    }
  }

  /** Tells the caller, from inside its abort, what the call it aborts is billed (request.onBilledAfterAbort); at most once. */
  private reportBilledAfterAbort(request: ChatRequest, answer: StreamedAnswer, requestChars: number): { reported: () => boolean; stop: () => void } {
    let reported = false;
    const onAbort = (): void => {
      if (reported || request.onBilledAfterAbort === undefined) return;
      reported = true;
      try {
        request.onBilledAfterAbort(this.cost(answer.usage, requestChars, answer.content, answer.toolCalls));
      } catch {
        // The caller's bookkeeping must not break its own abort.
      }
    };
    if (request.signal.aborted) onAbort();
    else request.signal.addEventListener('abort', onAbort, { once: true });
    return { reported: () => reported, stop: () => request.signal.removeEventListener('abort', onAbort) };
  }

  /** Reads a Chat Completions event stream to its end into `answer`, reporting the text so far after each piece of it. */
  private async readStream(body: ReadableStream<Uint8Array>, onText: (textSoFar: string) => void, answer: StreamedAnswer, billedSoFar: () => number): Promise<void> {
    // Set inside the parser's callback; an object, so that the reading loop sees the change.
    const failure: { problem: Error | null } = { problem: null };
    const parser = createParser({
      onEvent: (event) => {
        if (failure.problem !== null || answer.done) return;
        if (event.data.trim() === '[DONE]') {
          answer.done = true;
          return;
        }
        let json: unknown;
        try {
          json = JSON.parse(event.data);
        } catch (error) {
          failure.problem = new MalformedResponseError(`${this.name}: a streamed event is not JSON`, { cause: error, billedUsd: billedSoFar() });
          return;
        }
        const chunk = streamChunkSchema.safeParse(json);
        if (!chunk.success) {
          failure.problem = new MalformedResponseError(`${this.name}: a streamed event is not a chat completion chunk: ${z.prettifyError(chunk.error).replace(/\s*\n\s*/g, '; ')}`, { billedUsd: billedSoFar() });
          return;
        }
        if (chunk.data.error !== undefined && chunk.data.error !== null) {
          // An error after the 200: the answer is unusable, and a later call may well succeed.
          failure.problem = new ProviderUnavailableError(`${this.name}: the stream reported an error: ${this.redact(JSON.stringify(chunk.data.error).slice(0, MAX_ERROR_DETAIL_CHARS))}`, { billedUsd: billedSoFar() });
          return;
        }
        if (chunk.data.usage) answer.usage = chunk.data.usage;
        const choice = chunk.data.choices?.[0];
        if (choice === undefined) return;
        const delta = choice.delta;
        for (const call of delta?.tool_calls ?? []) {
          const index = call.index ?? (call.id ? answer.toolCalls.length : Math.max(0, answer.toolCalls.length - 1));
          // A call may only continue one already begun or start the next: a gap means deltas went missing.
          if (index > answer.toolCalls.length) {
            failure.problem = new MalformedResponseError(`${this.name}: streamed tool call ${index} skips calls`, { billedUsd: billedSoFar() });
            return;
          }
          const slot = (answer.toolCalls[index] ??= { id: '', name: '', arguments: '' });
          if (call.id) slot.id = call.id;
          const name = call.function?.name;
          // Servers differ: most send the name once, some repeat it whole in every delta, a few send it in pieces.
          if (name) slot.name = slot.name === '' || name.startsWith(slot.name) ? name : slot.name + name;
          if (call.function?.arguments) slot.arguments += call.function.arguments;
        }
        if (typeof delta?.content === 'string' && delta.content !== '') {
          answer.content = (answer.content ?? '') + delta.content;
          try {
            onText(answer.content);
          } catch {
            // Showing a draft must never cost the answer.
          }
        }
        if (choice.finish_reason) answer.finishReason = choice.finish_reason;
      },
    });
    const decoder = new TextDecoder();
    const reader = body.getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        parser.feed(decoder.decode(value, { stream: true }));
        if (failure.problem !== null || answer.done) break;
      }
      parser.feed(decoder.decode());
    } finally {
      await reader.cancel().catch(() => undefined);
    }
    if (failure.problem !== null) throw failure.problem;
    if (answer.finishReason === null) {
      throw new ProviderUnavailableError(`${this.name}: the stream ended before the answer was finished`, { billedUsd: billedSoFar() });
    }
  }

  private streamedCompletion(answer: StreamedAnswer, requestChars: number): ChatResponse {
    const toolCalls: ToolCall[] = [];
    for (let index = 0; index < answer.toolCalls.length; index += 1) {
      const call = answer.toolCalls[index];
      // A hole or a nameless call means deltas went missing: the calls cannot be trusted.
      if (call === undefined || call.id === '' || call.name === '') {
        const billedUsd = this.cost(answer.usage, requestChars, answer.content, answer.toolCalls).costUsd;
        throw new MalformedResponseError(`${this.name}: streamed tool call ${index} arrived without its ID or name`, { billedUsd });
      }
      toolCalls.push({ id: call.id, name: call.name, arguments: call.arguments });
    }
    return this.assemble(answer.content, toolCalls, answer.finishReason, answer.usage, requestChars);
  }

  private parseCompletion(text: string, requestChars: number): ChatResponse {
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch (error) {
      throw new MalformedResponseError(`${this.name}: response body is not JSON`, { cause: error });
    }
    const parsed = completionSchema.safeParse(json);
    if (!parsed.success) {
      throw new MalformedResponseError(`${this.name}: response body is not a chat completion: ${z.prettifyError(parsed.error).replace(/\s*\n\s*/g, '; ')}`);
    }
    const choice = parsed.data.choices[0];
    if (choice === undefined) throw new MalformedResponseError(`${this.name}: response has no choices`);
    const toolCalls: ToolCall[] = (choice.message.tool_calls ?? []).map((call) => ({ id: call.id, name: call.function.name, arguments: call.function.arguments }));
    return this.assemble(choice.message.content ?? null, toolCalls, choice.finish_reason ?? null, parsed.data.usage ?? null, requestChars);
  }

  /** The port's answer from what the wire delivered, whether in one body or streamed. */
  private assemble(
    content: string | null,
    toolCalls: ToolCall[],
    finishReason: string | null,
    usage: { prompt_tokens: number; completion_tokens: number } | null,
    requestChars: number,
  ): ChatResponse {
    // An answer refused here was billed all the same: the error carries its cost, for the owner's spend.
    const billed = this.cost(usage, requestChars, content, toolCalls);
    if (finishReason === 'content_filter') {
      throw new ProviderRequestError(`${this.name}: the provider's content filter stopped the answer`, { billedUsd: billed.costUsd });
    }
    if (content === null && toolCalls.length === 0) {
      throw new MalformedResponseError(`${this.name}: the message has neither content nor tool calls`, { billedUsd: billed.costUsd });
    }
    return {
      message: toolCalls.length > 0 ? { role: 'assistant', content, toolCalls } : { role: 'assistant', content },
      finishReason: finishReasonOf(finishReason, toolCalls.length > 0),
      usage: billed.usage,
      costUsd: billed.costUsd,
    };
  }

  /** Tokens and price of one answer; some compatible servers omit usage: estimated at four characters a token rather than zero. */
  private cost(
    usage: { prompt_tokens: number; completion_tokens: number } | null,
    requestChars: number,
    content: string | null,
    toolCalls: readonly { readonly name: string; readonly arguments: string }[],
  ): { usage: ChatResponse['usage']; costUsd: number } {
    const inputTokens = usage?.prompt_tokens ?? Math.ceil(requestChars / 4);
    const outputTokens = usage?.completion_tokens ?? Math.ceil(((content ?? '').length + toolCalls.reduce((sum, call) => sum + call.name.length + call.arguments.length, 0)) / 4);
    return { usage: { inputTokens, outputTokens }, costUsd: (inputTokens / 1000) * this.config.inputUsdPer1kTokens + (outputTokens / 1000) * this.config.outputUsdPer1kTokens };
  }

  private httpError(status: number, headers: Headers, text: string): Error {
    const { code, message } = this.errorDetail(text);
    const described = `${this.name}: HTTP ${status}${message === '' ? '' : `: ${message}`}`;
    // Raw (finite, not capped): what the server asked for. The caller caps it (`maxServerDelayMs`).
    const retryAfterMs = parseRetryAfter(headers.get('retry-after'), this.clock.now()) ?? undefined;
    return providerErrorForStatus(status, described, { retryAfterMs, contextTooLong: isContextLengthError(code, message) });
  }

  /** The provider's error code and message from an error body, if it has the usual shape; else the text itself. */
  private errorDetail(text: string): { code: string | undefined; message: string } {
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      return { code: undefined, message: this.redact(text.trim().slice(0, MAX_ERROR_DETAIL_CHARS)) };
    }
    const parsed = errorBodySchema.safeParse(json);
    if (!parsed.success) return { code: undefined, message: this.redact(text.trim().slice(0, MAX_ERROR_DETAIL_CHARS)) };
    const error = parsed.data.error;
    if (typeof error === 'string') return { code: undefined, message: this.redact(error.slice(0, MAX_ERROR_DETAIL_CHARS)) };
    const code = error.code ?? undefined;
    return { code: code === undefined ? undefined : String(code), message: this.redact((error.message ?? '').slice(0, MAX_ERROR_DETAIL_CHARS)) };
  }

  private redact(text: string): string {
    const key = this.config.apiKey;
    return key === undefined ? text : text.split(key).join('[redacted]');
  }
}

/** Validates the config (TerminalError `invalid_input` on a bad one; the key is never echoed) and builds the provider. */
export function createOpenAiCompatibleProvider(config: OpenAiCompatibleConfig, dependencies: OpenAiCompatibleDependencies = {}): ModelProvider {
  const parsed = openAiCompatibleConfigSchema.safeParse(config);
  if (!parsed.success) {
    const problems = parsed.error.issues.map((issue) => `${issue.path.join('.') || '(config)'}: ${issue.message}`).join('; ');
    throw new TerminalError(`Invalid openai-compatible provider config: ${problems}`, { code: 'invalid_input' });
  }
  return new OpenAiCompatibleProvider(parsed.data, dependencies.clock ?? systemClock, dependencies.fetch ?? fetch);
}
