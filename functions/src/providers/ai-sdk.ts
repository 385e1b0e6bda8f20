/**
 * A model provider for any model the Vercel AI SDK can talk to: hand in a `LanguageModel` built by
 * an `@ai-sdk/*` package (Anthropic, Google, Bedrock, Mistral, OpenAI, an OpenAI-compatible server,
 * the gateway) and the engine drives it through the same port as its own clients. The own
 * OpenAI-compatible client (openai-compatible.ts) stays the default for that wire: it has no
 * dependency and validates every byte itself; this adapter is the seam for every other provider.
 *
 * What the adapter keeps to, whatever the model behind it:
 * - One call is one model request: the SDK's own retries are off (`maxRetries: 0`). Retries are the
 *   engine's, which sees and counts each one; the SDK's would be paid for invisibly.
 * - Always streamed: text reaches `onText` as it is written, tool calls are assembled from the
 *   stream, and a call cut off midway (aborted, timed out, failed) is billed what was streamed.
 * - Failures become the port's error classes (rate limited, unavailable, timeout, context window,
 *   malformed, rejected), judged by the SDK's typed errors and HTTP status, never by catching all.
 *   `Retry-After` reaches the caller raw but finite, for it to cap (`maxServerDelayMs`), exactly as
 *   from the own client.
 * - The step's abort signal is passed to the model; an abort is the caller's, never a provider fault.
 *
 * Version (ai 6.0.x with @ai-sdk/provider 3.0.x, whose models speak LanguageModel spec V3; ai 6
 * also takes V2 models): ai 7 and its provider packages declare `engines.node >=22`, and Phaseline
 * runs on Node 20 as well as 22 (this machine, and either Cloud Functions runtime). ai 6 declares
 * `>=18`, ships CommonJS beside ESM (the functions package is CommonJS), and its only newer Node API,
 * `process.getBuiltinModule` (Node 20.16 and 22.3), sits on the file-download path this adapter
 * never takes. `@ai-sdk/openai-compatible` 2.0.x returns V3 models, the spec ai 6 speaks.
 */
import type { LanguageModelV2, LanguageModelV3, SharedV3ProviderOptions } from '@ai-sdk/provider';
import { createRequire } from 'node:module';
import type { APICallError, LanguageModelUsage, ModelMessage, TextStreamPart, ToolSet } from 'ai';
import { z } from 'zod';
import {
  ContextWindowError,
  MalformedResponseError,
  ProviderRateLimitedError,
  ProviderRequestError,
  ProviderTimeoutError,
  ProviderUnavailableError,
  type BilledCall,
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
import { isContextLengthError } from './openai-compatible';

/** A model object from any `@ai-sdk/*` provider package (spec V3, or V2 from older packages). */
export type AiSdkLanguageModel = LanguageModelV3 | LanguageModelV2;

/** The adapter's settings beside the model: the same limits and price table as the own client's. */
export const aiSdkProviderSettingsSchema = z.strictObject({
  /** For people and cost records; defaults to `ai-sdk:<provider>:<modelId>`. */
  name: z.string().trim().min(1).optional(),
  timeoutMs: z.int().min(1).max(3_600_000),
  contextWindowTokens: z.int().min(1),
  inputUsdPer1kTokens: z.number().min(0),
  outputUsdPer1kTokens: z.number().min(0),
});

export type AiSdkProviderSettings = Readonly<z.output<typeof aiSdkProviderSettingsSchema>>;

/** What `createAiSdkProvider` takes: a model object and its settings. */
export interface AiSdkProviderOptions extends AiSdkProviderSettings {
  /** e.g. `anthropic('claude-sonnet-4-5')`: an object, not a string ID (a string would go to the gateway unasked). */
  readonly model: AiSdkLanguageModel;
  /** Passed to the model as they are (e.g. `{ anthropic: { thinking: ... } }`). */
  readonly providerOptions?: SharedV3ProviderOptions;
}

export interface AiSdkProviderDependencies {
  /** Resolves `Retry-After` dates; defaults to the system clock. */
  readonly clock?: Clock;
}

/**
 * The AI SDK, required at its first use, not at cold start: a deployment whose pipelines call no AI
 * SDK model does not load it (bench/cold-start.ts). Its CommonJS build, as it was loaded before.
 */
const loadPackage = createRequire(__filename);
let aiSdkModule: typeof import('ai') | undefined;
function aiSdk(): typeof import('ai') {
  aiSdkModule ??= loadPackage('ai') as typeof import('ai');
  return aiSdkModule;
}

/** The longest provider error text carried into an error message. */
const MAX_ERROR_DETAIL_CHARS = 300;

/** The parts of an SDK error's parsed body that tell its kind: OpenAI's `error.code`, Anthropic's `error.type`. */
const errorDataSchema = z.looseObject({
  error: z.looseObject({ code: z.union([z.string(), z.number()]).nullish(), type: z.string().nullish() }),
});

/** The answer as far as the stream has delivered it. */
interface StreamedAnswer {
  /** The model's first chunk arrived: from here a cut-off call is billed. */
  began: boolean;
  content: string | null;
  readonly toolCalls: ToolCall[];
  /** Raw argument text of each tool call as it streams, by call ID (the SDK hands the finished call over parsed). */
  readonly toolInputs: Map<string, string>;
  /** Characters of output streamed so far (text, reasoning, tool names and arguments): the estimate when usage is missing. */
  outputChars: number;
  usage: LanguageModelUsage | null;
  finishReason: string | null;
  rawFinishReason: string | undefined;
}

/** The port's messages as the SDK's: tool calls carry their arguments parsed, tool results their text. */
export function toModelMessages(messages: readonly ChatMessage[]): ModelMessage[] {
  return messages.map((message): ModelMessage => {
    switch (message.role) {
      case 'system':
        return { role: 'system', content: message.content };
      case 'user':
        return { role: 'user', content: message.content };
      case 'assistant': {
        const calls = message.toolCalls ?? [];
        if (calls.length === 0) return { role: 'assistant', content: message.content ?? '' };
        return {
          role: 'assistant',
          content: [
            ...(message.content === null || message.content === '' ? [] : [{ type: 'text' as const, text: message.content }]),
            ...calls.map((call) => ({ type: 'tool-call' as const, toolCallId: call.id, toolName: call.name, input: parseArguments(call.arguments) })),
          ],
        };
      }
      case 'tool':
        return { role: 'tool', content: [{ type: 'tool-result', toolCallId: message.toolCallId, toolName: message.name, output: { type: 'text', value: message.content } }] };
    }
  });
}

/** Arguments as the SDK wants them (a value); text that is not JSON is kept as a string, as the model wrote it. */
function parseArguments(text: string): unknown {
  if (text.trim() === '') return {};
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return text;
  }
}

/** The port's tools as an SDK tool set without `execute`: the SDK hands the calls back and runs none (the engine's toolbox does). */
export function toToolSet(tools: readonly ToolSpec[]): ToolSet {
  const set: ToolSet = {};
  // The schema is the model's to read; arguments are validated by the toolbox, not refused here.
  for (const spec of tools) set[spec.name] = { description: spec.description, inputSchema: aiSdk().jsonSchema(spec.parameters) };
  return set;
}

class AiSdkProvider implements ModelProvider {
  readonly name: string;
  readonly contextWindowTokens: number;

  constructor(
    private readonly model: AiSdkLanguageModel,
    private readonly settings: AiSdkProviderSettings,
    private readonly providerOptions: SharedV3ProviderOptions | undefined,
    private readonly clock: Clock,
  ) {
    this.name = settings.name ?? `ai-sdk:${model.provider}:${model.modelId}`;
    this.contextWindowTokens = settings.contextWindowTokens;
  }

  async chat(request: ChatRequest): Promise<ChatResponse> {
    request.signal.throwIfAborted();
    // What an input estimate counts when the model reports no usage: the request as text.
    const requestChars = JSON.stringify({ messages: request.messages, tools: request.tools }).length;
    // The caller's limit (what is left of its step) may be shorter than ours; the shorter one wins.
    const callerLimitMs = request.timeoutMs !== undefined && request.timeoutMs >= 0 ? request.timeoutMs : Number.POSITIVE_INFINITY;
    const timeoutMs = Math.max(1, Math.floor(Math.min(this.settings.timeoutMs, callerLimitMs)));
    const timeout = AbortSignal.timeout(timeoutMs);
    const answer: StreamedAnswer = { began: false, content: null, toolCalls: [], toolInputs: new Map(), outputChars: 0, usage: null, finishReason: null, rawFinishReason: undefined };
    const billed = (): { billedUsd?: number } => (answer.began ? { billedUsd: this.cost(answer, requestChars).costUsd } : {});
    const billedAfterAbort = this.reportBilledAfterAbort(request, answer, requestChars);
    try {
      let failure: { error: unknown } | null = null;
      try {
        const result = aiSdk().streamText({
          model: this.model,
          messages: toModelMessages(request.messages),
          // The port's system messages are the pipeline's own prompt, never user input: no warning.
          allowSystemInMessages: true,
          ...(request.tools.length > 0 ? { tools: toToolSet(request.tools) } : {}),
          ...(request.maxOutputTokens === undefined ? {} : { maxOutputTokens: request.maxOutputTokens }),
          ...(this.providerOptions === undefined ? {} : { providerOptions: this.providerOptions }),
          maxRetries: 0,
          abortSignal: AbortSignal.any([request.signal, timeout]),
          // Errors arrive as stream parts and are translated below; the default would print them.
          onError: () => undefined,
        });
        for await (const part of result.fullStream) {
          if (part.type === 'error') {
            failure = { error: part.error };
            break;
          }
          this.take(part, answer, request.onText);
        }
      } catch (error) {
        failure = { error };
      }
      // The caller's abort wins: it is theirs to interpret (cancellation, lost claim), not a provider fault.
      if (request.signal.aborted) throw request.signal.reason as Error;
      // Timed out before the answer finished (an answer that finished as the timer fired is still the answer).
      if (timeout.aborted && (failure !== null || answer.finishReason === null)) throw new ProviderTimeoutError(`${this.name}: no answer within ${timeoutMs} ms`, { ...(failure === null ? {} : { cause: failure.error }), ...billed() });
      if (failure !== null) throw this.translate(failure.error, billed());
      return this.assemble(answer, requestChars);
    } finally {
      billedAfterAbort.stop();
    }
  }

  /** Folds one stream part into the answer, showing the text so far after each piece of it. */
  private take(part: TextStreamPart<ToolSet>, answer: StreamedAnswer, onText: ((textSoFar: string) => void) | undefined): void {
    switch (part.type) {
      case 'start-step':
        answer.began = true;
        return;
      case 'text-delta':
        if (part.text === '') return;
        answer.content = (answer.content ?? '') + part.text;
        answer.outputChars += part.text.length;
        if (onText !== undefined) {
          try {
            onText(answer.content);
          } catch {
            // Showing a draft must never cost the answer.
          }
        }
        return;
      case 'reasoning-delta':
        // Reasoning is billed as output though it is not part of the answer.
        answer.outputChars += part.text.length;
        return;
      case 'tool-input-start':
        answer.toolInputs.set(part.id, answer.toolInputs.get(part.id) ?? '');
        answer.outputChars += part.toolName.length;
        return;
      case 'tool-input-delta':
        answer.toolInputs.set(part.id, (answer.toolInputs.get(part.id) ?? '') + part.delta);
        answer.outputChars += part.delta.length;
        return;
      case 'tool-call': {
        // A tool the provider ran itself (its own web search) has no call for the engine to answer.
        if (part.providerExecuted === true) return;
        const started = answer.toolInputs.has(part.toolCallId);
        const streamed = answer.toolInputs.get(part.toolCallId) ?? '';
        // Streamed argument text is kept as the model wrote it; a call that arrived whole carries it parsed.
        const text = streamed !== '' ? streamed : typeof part.input === 'string' && part.invalid === true ? part.input : JSON.stringify(part.input ?? {});
        if (streamed === '') answer.outputChars += (started ? 0 : part.toolName.length) + text.length;
        answer.toolCalls.push({ id: part.toolCallId, name: part.toolName, arguments: text });
        return;
      }
      case 'finish-step':
        answer.usage = part.usage;
        answer.finishReason = part.finishReason;
        answer.rawFinishReason = part.rawFinishReason;
        return;
      default:
        return;
    }
  }

  /** The port's answer from what the stream delivered; an answer refused here was billed all the same. */
  private assemble(answer: StreamedAnswer, requestChars: number): ChatResponse {
    const billed = this.cost(answer, requestChars);
    const billedUsd = billed.costUsd;
    // No finish at all, or an "other" the provider did not name: the stream ended before the answer did.
    if (answer.finishReason === null || answer.finishReason === 'error' || (answer.finishReason === 'other' && answer.rawFinishReason === undefined)) {
      throw new ProviderUnavailableError(`${this.name}: the stream ended before the answer was finished`, { billedUsd });
    }
    if (answer.finishReason === 'content-filter') {
      throw new ProviderRequestError(`${this.name}: the provider's content filter stopped the answer`, { billedUsd });
    }
    const { content, toolCalls } = answer;
    if (content === null && toolCalls.length === 0) {
      throw new MalformedResponseError(`${this.name}: the answer has neither text nor tool calls`, { billedUsd });
    }
    return {
      message: toolCalls.length > 0 ? { role: 'assistant', content, toolCalls: [...toolCalls] } : { role: 'assistant', content },
      finishReason: toolCalls.length > 0 ? 'tool_calls' : answer.finishReason === 'length' ? 'length' : 'stop',
      usage: billed.usage,
      costUsd: billedUsd,
    };
  }

  /** Tells the caller, from inside its abort, what the call it aborts is billed (request.onBilledAfterAbort); at most once. */
  private reportBilledAfterAbort(request: ChatRequest, answer: StreamedAnswer, requestChars: number): { stop: () => void } {
    const onAbort = (): void => {
      // Before the model's first chunk nothing was answered, so nothing is billed (as with the own client before its 2xx).
      if (!answer.began || request.onBilledAfterAbort === undefined) return;
      try {
        request.onBilledAfterAbort(this.cost(answer, requestChars));
      } catch {
        // The caller's bookkeeping must not break its own abort.
      }
    };
    request.signal.addEventListener('abort', onAbort, { once: true });
    return { stop: () => request.signal.removeEventListener('abort', onAbort) };
  }

  /** Tokens and price of one answer: the reported usage, else estimated at four characters a token rather than zero. */
  private cost(answer: StreamedAnswer, requestChars: number): BilledCall {
    const inputTokens = answer.usage?.inputTokens ?? Math.ceil(requestChars / 4);
    const outputTokens = answer.usage?.outputTokens ?? Math.ceil(answer.outputChars / 4);
    return {
      usage: { inputTokens, outputTokens },
      costUsd: (inputTokens / 1000) * this.settings.inputUsdPer1kTokens + (outputTokens / 1000) * this.settings.outputUsdPer1kTokens,
    };
  }

  /** An SDK failure as the port's error class; `billed` is what the call cost if the model had begun to answer. */
  private translate(error: unknown, billed: { billedUsd?: number }): Error {
    const sdk = aiSdk();
    // Retries are off, so a RetryError is unexpected; its last error is the one that counts.
    if (sdk.RetryError.isInstance(error)) return this.translate(error.lastError, billed);
    const options = { cause: error, ...billed };
    const detail = describe(error);
    if (sdk.APICallError.isInstance(error)) return this.apiCallError(error, options);
    if (sdk.LoadAPIKeyError.isInstance(error) || sdk.LoadSettingError.isInstance(error)) return new ProviderRequestError(`${this.name}: not configured: ${detail}`, options);
    if (sdk.NoSuchModelError.isInstance(error) || sdk.UnsupportedFunctionalityError.isInstance(error) || sdk.InvalidPromptError.isInstance(error) || sdk.InvalidArgumentError.isInstance(error)) {
      return new ProviderRequestError(`${this.name}: request refused: ${detail}`, options);
    }
    if (isMalformedAnswer(error)) return new MalformedResponseError(`${this.name}: not a valid answer: ${detail}`, options);
    // The model stream ended with no finish chunk and no output.
    if (sdk.NoOutputGeneratedError.isInstance(error)) return new ProviderUnavailableError(`${this.name}: the stream ended before the answer was finished`, options);
    // A connection reset, or an error event inside a stream that had already begun: a later call may well succeed.
    return new ProviderUnavailableError(`${this.name}: request failed: ${detail}`, options);
  }

  /** An HTTP failure by its status, as the own client judges one (429, 5xx, 408, 400 context, other 4xx). */
  private apiCallError(error: APICallError, options: { cause: unknown; billedUsd?: number }): Error {
    const status = error.statusCode;
    const message = error.message.slice(0, MAX_ERROR_DETAIL_CHARS);
    // No status: the request never got an answer (connection refused, DNS).
    if (status === undefined) return new ProviderUnavailableError(`${this.name}: request failed: ${message}`, options);
    // The SDK's wrapper for an answer that broke while it was read (a dropped connection, a body that would not parse).
    if (status < 400) {
      if (isMalformedAnswer(error.cause)) return new MalformedResponseError(`${this.name}: not a valid answer: ${describe(error.cause)}`, options);
      return new ProviderUnavailableError(`${this.name}: the answer broke off after HTTP ${status}: ${describe(error.cause ?? error)}`, options);
    }
    const described = `${this.name}: HTTP ${status}: ${message}`;
    // Raw (finite, not capped): what the server asked for. The caller caps it (`maxServerDelayMs`).
    const retryAfterMs = parseRetryAfter(headerOf(error.responseHeaders, 'retry-after'), this.clock.now()) ?? undefined;
    const hint = retryAfterMs === undefined ? {} : { retryAfterMs };
    if (status === 429) return new ProviderRateLimitedError(described, retryAfterMs, options);
    // 5xx and Anthropic's 529 "overloaded".
    if (status >= 500) return new ProviderUnavailableError(described, { ...options, ...hint });
    if (status === 408) return new ProviderTimeoutError(described, options);
    if (status === 413 || (status === 400 && isContextLengthError(errorCode(error.data), error.message))) return new ContextWindowError(described, options);
    return new ProviderRequestError(described, options);
  }
}

/** The SDK's errors for an answer that arrived but is not one (unparseable, failing its schema, empty). */
function isMalformedAnswer(error: unknown): boolean {
  const sdk = aiSdk();
  return (
    sdk.InvalidResponseDataError.isInstance(error) ||
    sdk.JSONParseError.isInstance(error) ||
    sdk.TypeValidationError.isInstance(error) ||
    sdk.EmptyResponseBodyError.isInstance(error) ||
    sdk.NoContentGeneratedError.isInstance(error)
  );
}

/** A response header by name, whatever its case (providers hand headers over as a plain record). */
function headerOf(headers: Readonly<Record<string, string>> | undefined, name: string): string | undefined {
  if (headers === undefined) return undefined;
  const key = Object.keys(headers).find((candidate) => candidate.toLowerCase() === name);
  return key === undefined ? undefined : headers[key];
}

/** The provider's error code from its parsed error body (`error.code`, else `error.type`), when it has one. */
function errorCode(data: unknown): string | undefined {
  const parsed = errorDataSchema.safeParse(data);
  if (!parsed.success) return undefined;
  const code = parsed.data.error.code ?? parsed.data.error.type ?? undefined;
  return code === undefined ? undefined : String(code);
}

function describe(error: unknown): string {
  if (error instanceof Error) return error.message.slice(0, MAX_ERROR_DETAIL_CHARS);
  if (typeof error === 'string') return error.slice(0, MAX_ERROR_DETAIL_CHARS);
  if (typeof error !== 'object' || error === null) return String(error).slice(0, MAX_ERROR_DETAIL_CHARS);
  // An error event's payload, a plain object as the provider sent it.
  try {
    return JSON.stringify(error).slice(0, MAX_ERROR_DETAIL_CHARS);
  } catch {
    return 'an error event that cannot be shown';
  }
}

/**
 * Builds a ModelProvider around an AI SDK model. Validates the settings (TerminalError
 * `invalid_input` on bad ones) and refuses a string model ID: a string would be resolved by the
 * SDK's global provider (the Vercel gateway) behind the caller's back.
 *
 * @example
 * const provider = createAiSdkProvider({
 *   model: anthropic('claude-sonnet-4-5'),
 *   timeoutMs: 120_000,
 *   contextWindowTokens: 200_000,
 *   inputUsdPer1kTokens: 0.003,
 *   outputUsdPer1kTokens: 0.015,
 * });
 */
export function createAiSdkProvider(options: AiSdkProviderOptions, dependencies: AiSdkProviderDependencies = {}): ModelProvider {
  const { model, providerOptions, ...settings } = options;
  const modelValue: unknown = model;
  if (typeof modelValue !== 'object' || modelValue === null || typeof (modelValue as { doStream?: unknown }).doStream !== 'function') {
    throw new TerminalError('Invalid ai-sdk provider config: model: expected a language model object from an @ai-sdk/* package', { code: 'invalid_input' });
  }
  const parsed = aiSdkProviderSettingsSchema.safeParse(settings);
  if (!parsed.success) {
    const problems = parsed.error.issues.map((issue) => `${issue.path.join('.') || '(config)'}: ${issue.message}`).join('; ');
    throw new TerminalError(`Invalid ai-sdk provider config: ${problems}`, { code: 'invalid_input' });
  }
  return new AiSdkProvider(model, parsed.data, providerOptions, dependencies.clock ?? systemClock);
}
