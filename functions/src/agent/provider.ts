/**
 * The model-provider port: tool-calling chat in the shape every Chat Completions-style API shares.
 * Providers translate their wire format to this and their failures to the error types below, so
 * recovery code never matches on strings.
 */
import { PhaselineError, RetryableError, type ErrorCode, type PhaselineErrorOptions } from '../core/errors';

/** A tool call the model asked for: its ID within the thread, the tool name and the arguments as JSON text. */
export interface ToolCall {
  readonly id: string;
  readonly name: string;
  /** JSON text, exactly as the model produced it. */
  readonly arguments: string;
}

/** What a citation needs of one source a tool result (or a prompt) drew on; `fetchedAt` is ISO 8601. */
export interface Source {
  readonly url: string;
  readonly title: string;
  /** The part of the source the result showed (a snippet, an excerpt). */
  readonly passage: string;
  readonly fetchedAt: string;
  /** Where the full text was kept, when the result carries only part of it. */
  readonly artifact?: { readonly ref: string; readonly sha256: string; readonly size: number };
}

/** A source as recorded in a thread, with the number the model was shown for citing it (`[n]`). */
export interface NumberedSource extends Source {
  readonly number: number;
}

/**
 * `sources` records, beside the text, what the message showed the model as numbered sources. It
 * is bookkeeping for citations and never part of a provider request (the runner strips it).
 */
export type ChatMessage =
  | { readonly role: 'system'; readonly content: string }
  /** `promptId` marks the exact prompt of a section; warm repair keeps everything up to it. */
  | { readonly role: 'user'; readonly content: string; readonly promptId?: string; readonly sources?: readonly NumberedSource[] }
  | { readonly role: 'assistant'; readonly content: string | null; readonly toolCalls?: readonly ToolCall[] }
  | { readonly role: 'tool'; readonly toolCallId: string; readonly name: string; readonly content: string; readonly sources?: readonly NumberedSource[] };

/** A tool as the model is offered it: name, description, JSON schema of its arguments. */
export interface ToolSpec {
  readonly name: string;
  readonly description: string;
  /** JSON Schema of the arguments object. */
  readonly parameters: Readonly<Record<string, unknown>>;
}

/** One model call: the thread so far, the tools on offer and the limits of the call. */
export interface ChatRequest {
  readonly messages: readonly ChatMessage[];
  readonly tools: readonly ToolSpec[];
  readonly maxOutputTokens?: number;
  readonly signal: AbortSignal;
  /**
   * The longest the caller waits for this answer (what is left of its step, at most its per-call
   * limit). A provider gives up by then, whichever of this and its own timeout is shorter, and
   * throws ProviderTimeoutError; absent, only its own timeout applies.
   */
  readonly timeoutMs?: number;
  /**
   * Asks for the answer as it is written: called with the answer's text so far, each time more of
   * it arrives. Only for showing a draft; what the call returns is still the complete answer, and
   * a call that fails midway returns nothing (the draft it showed is not an answer).
   */
  readonly onText?: (textSoFar: string) => void;
  /**
   * Told what the provider still bills for a call the caller aborts after the provider began to
   * answer: called at most once, synchronously inside the abort (so whoever aborted can count it at
   * once), with the usage the provider reported or else an estimate (four characters a token: the
   * request's for input, what had been streamed for output). The call then fails with the abort's
   * reason as always. A provider that cannot tell (one that bills nothing) never calls it.
   */
  readonly onBilledAfterAbort?: (billed: BilledCall) => void;
}

/** What one call was billed, its answer used or not. */
export interface BilledCall {
  readonly usage: Usage;
  readonly costUsd: number;
}

/** Tokens one model call used, as the provider reported them. */
export interface Usage {
  readonly inputTokens: number;
  readonly outputTokens: number;
}

/** A model call's answer: the assistant message (text or tool calls), why it finished, its usage and its cost. */
export interface ChatResponse {
  readonly message: Extract<ChatMessage, { role: 'assistant' }>;
  readonly finishReason: 'stop' | 'tool_calls' | 'length';
  readonly usage: Usage;
  /** What the call cost, in US dollars, as the provider prices it (0 for the offline provider). */
  readonly costUsd: number;
}

/** The port every model backend implements (offline simulator, Chat Completions, AI SDK): one chat call, errors typed by whether a retry can help. */
export interface ModelProvider {
  /** For people and cost records: e.g. `offline` or `openai-compatible:gpt-4o-mini`. */
  readonly name: string;
  /** The context window in tokens, for compaction decisions. */
  readonly contextWindowTokens: number;
  chat(request: ChatRequest): Promise<ChatResponse>;
}

/** 429: the provider asks us to slow down, possibly saying for how long. */
export class ProviderRateLimitedError extends RetryableError {
  constructor(message: string, retryAfterMs?: number, options: PhaselineErrorOptions = {}) {
    super(message, { ...options, code: 'rate_limited', ...(retryAfterMs === undefined ? {} : { retryAfterMs }) });
  }
}

/** The base of a provider error class whose instances all carry `code`: retryable ones are RetryableErrors. */
function providerErrorWith(code: ErrorCode, retryable: boolean) {
  if (retryable) {
    return class extends RetryableError {
      constructor(message: string, options: PhaselineErrorOptions = {}) {
        super(message, { ...options, code });
      }
    };
  }
  return class extends PhaselineError {
    constructor(message: string, options: PhaselineErrorOptions = {}) {
      super(code, false, message, options);
    }
  };
}

/** 5xx or a connection failure: the provider is (perhaps briefly) down. */
export class ProviderUnavailableError extends providerErrorWith('provider_unavailable', true) {}

/** No answer within the deadline. The call may or may not have been processed. */
export class ProviderTimeoutError extends providerErrorWith('timeout', true) {}

/** The request does not fit the model's context window: shrink the transcript, do not just retry. */
export class ContextWindowError extends providerErrorWith('context_window', false) {}

/** The provider answered with something that is not a valid response. Retrying may help. */
export class MalformedResponseError extends providerErrorWith('malformed_response', true) {}

/** Bad key, unknown model, invalid request: retrying cannot help. */
export class ProviderRequestError extends providerErrorWith('provider_rejected', false) {}

/**
 * The port's error for an HTTP provider's error status: 429 rate limited, 5xx unavailable, 408 a
 * timeout, 400 about the context's length a context window error, any other a refused request.
 * Every HTTP adapter answers with it, and the offline simulator for the statuses it fakes.
 */
export function providerErrorForStatus(status: number, message: string, detail: { readonly retryAfterMs?: number | undefined; readonly contextTooLong?: boolean } = {}): PhaselineError {
  const { retryAfterMs } = detail;
  if (status === 429) return new ProviderRateLimitedError(message, retryAfterMs);
  if (status >= 500) return new ProviderUnavailableError(message, retryAfterMs === undefined ? {} : { retryAfterMs });
  if (status === 408) return new ProviderTimeoutError(message);
  if (status === 400 && detail.contextTooLong === true) return new ContextWindowError(message);
  return new ProviderRequestError(message);
}

/** Errors that say the provider as a whole is unhealthy (they feed the shared circuit). */
export function isProviderOutage(error: unknown): error is ProviderRateLimitedError | ProviderUnavailableError | ProviderTimeoutError {
  return error instanceof ProviderRateLimitedError || error instanceof ProviderUnavailableError || error instanceof ProviderTimeoutError;
}
