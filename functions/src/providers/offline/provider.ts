/**
 * The offline model provider: the embedded default. No network; the scripted agent in `agent.ts`
 * decides each message, and the simulator settings add latency and faults that replay for a seed.
 * Faults are thrown as the port's error classes, exactly as a real provider adapter would throw
 * them, so recovery code is exercised without a model or a network.
 */
import {
  ContextWindowError,
  MalformedResponseError,
  providerErrorForStatus,
  ProviderRequestError,
  ProviderTimeoutError,
  type ChatMessage,
  type ChatRequest,
  type ChatResponse,
  type ModelProvider,
  type ToolSpec,
} from '../../agent/provider';
import type { Clock } from '../../core/clock';
import { nextAgentTurn } from './agent';
import { activeErrorWave, parseOfflineSettings, type OfflineSettings, type OfflineSettingsInput } from './settings';
import { digest, unitInterval } from './text';

/** Waits `ms`, or rejects with the signal's reason as soon as it is aborted. */
export type Sleep = (ms: number, signal: AbortSignal) => Promise<void>;

export const realSleep: Sleep = (ms, signal) =>
  new Promise<void>((resolve, reject) => {
    if (signal.aborted) {
      reject(signal.reason as Error);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal.reason as Error);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });

export type OfflineFaultKind = 'rate_limited' | 'unavailable' | 'timeout' | 'context_window' | 'malformed' | 'rejected';

export interface OfflineProviderStats {
  /** Every call to `chat`, whatever its outcome. */
  readonly calls: number;
  /** Calls that returned a message. */
  readonly responses: number;
  readonly faults: Readonly<Record<OfflineFaultKind, number>>;
}

export interface OfflineProvider extends ModelProvider {
  readonly seed: number;
  readonly settings: OfflineSettings;
  stats(): OfflineProviderStats;
}

export interface OfflineProviderOptions {
  readonly seed: number;
  readonly settings?: OfflineSettingsInput;
  readonly clock: Clock;
  /** Defaults to a real timer; tests pass one that records the wait and returns at once. */
  readonly sleep?: Sleep;
}

/** The estimate every offline figure uses: four characters a token, rounded up. */
export function estimateTokens(text: string): number {
  return Math.ceil(text.length / 4);
}

const MESSAGE_OVERHEAD_TOKENS = 4;

/** Input tokens of a request: message text, tool calls and tool specs, plus a small overhead per message. */
export function estimateRequestTokens(messages: readonly ChatMessage[], tools: readonly ToolSpec[]): number {
  let tokens = estimateTokens(JSON.stringify(tools));
  for (const message of messages) {
    tokens += MESSAGE_OVERHEAD_TOKENS + estimateTokens(message.content ?? '');
    if (message.role === 'assistant') {
      for (const call of message.toolCalls ?? []) tokens += estimateTokens(call.id + call.name + call.arguments);
    }
  }
  return tokens;
}

/** A key for "this exact request", independent of how the message objects were built. */
function requestKey(request: ChatRequest): string {
  const canonical = request.messages.map((message) => {
    switch (message.role) {
      case 'assistant':
        return ['assistant', message.content, (message.toolCalls ?? []).map((call) => [call.id, call.name, call.arguments])];
      case 'tool':
        return ['tool', message.toolCallId, message.name, message.content];
      default:
        return [message.role, message.content];
    }
  });
  return digest(JSON.stringify([canonical, request.tools.map((tool) => tool.name), request.maxOutputTokens ?? null]));
}

/** How long the caller waits for this call, in whole milliseconds (no limit when it set none). */
function callerLimitMs(request: ChatRequest): number {
  return request.timeoutMs !== undefined && request.timeoutMs >= 0 ? Math.floor(request.timeoutMs) : Number.POSITIVE_INFINITY;
}

/** Bounds the memory of requests seen (for attempt numbers) in a long-lived process. */
const MAX_REMEMBERED_REQUESTS = 10_000;

/** Streaming: the share of the latency before the answer is decided, and the pieces its text arrives in over the rest. */
const STREAM_DECIDED_AT = 0.5;
const STREAM_PIECES = 3;

class OfflineProviderImpl implements OfflineProvider {
  readonly name = 'offline';
  readonly contextWindowTokens: number;
  private readonly attempts = new Map<string, number>();
  private calls = 0;
  private responses = 0;
  private readonly faults: Record<OfflineFaultKind, number> = {
    rate_limited: 0,
    unavailable: 0,
    timeout: 0,
    context_window: 0,
    malformed: 0,
    rejected: 0,
  };

  constructor(
    readonly seed: number,
    readonly settings: OfflineSettings,
    private readonly clock: Clock,
    private readonly sleep: Sleep,
  ) {
    this.contextWindowTokens = settings.contextWindowTokens;
  }

  stats(): OfflineProviderStats {
    return { calls: this.calls, responses: this.responses, faults: { ...this.faults } };
  }

  async chat(request: ChatRequest): Promise<ChatResponse> {
    this.calls += 1;
    request.signal.throwIfAborted();
    const nowMs = this.clock.now();
    const key = requestKey(request);
    const attempt = this.nextAttempt(key);
    const settings = this.settings;

    const wave = activeErrorWave(settings, nowMs);
    if (wave !== undefined) {
      await this.latency(request);
      const offsetMs = nowMs - settings.epochMs;
      const limited = wave.status === 429;
      this.faults[limited ? 'rate_limited' : 'unavailable'] += 1;
      // The wave's status as a provider's answer would carry it: the port's error for it, as an HTTP adapter throws.
      const said = `Offline simulator: ${wave.status} ${limited ? 'rate limited' : 'unavailable'} (error wave ${wave.startMs}-${wave.endMs} ms, now at ${offsetMs} ms)`;
      throw providerErrorForStatus(wave.status, said, { retryAfterMs: wave.retryAfterMs });
    }

    const inputTokens = estimateRequestTokens(request.messages, request.tools);
    if (inputTokens > settings.contextWindowTokens) {
      await this.latency(request);
      this.faults.context_window += 1;
      throw new ContextWindowError(`Offline simulator: request of about ${inputTokens} tokens exceeds the context window of ${settings.contextWindowTokens}`);
    }

    if (settings.timeoutRate > 0 && unitInterval(this.seed, 'timeout', key, attempt) < settings.timeoutRate) {
      const waitedMs = Math.min(settings.timeoutMs, callerLimitMs(request));
      if (waitedMs > 0) await this.sleep(waitedMs, request.signal);
      this.faults.timeout += 1;
      throw new ProviderTimeoutError(`Offline simulator: no answer within ${waitedMs} ms`);
    }

    // Asked to stream, the answer is decided halfway through the latency and shown as it is "written" over the rest.
    const streaming = request.onText !== undefined;
    await this.latency(request, streaming ? STREAM_DECIDED_AT : 1);
    if (settings.malformedRate > 0 && unitInterval(this.seed, 'malformed', key, attempt) < settings.malformedRate) {
      this.faults.malformed += 1;
      // A broken answer takes as long to arrive whether or not it streams.
      if (streaming) await this.latency(request, 1 - STREAM_DECIDED_AT);
      throw new MalformedResponseError('Offline simulator: the response body was not a valid chat completion');
    }

    let turn;
    try {
      turn = nextAgentTurn(this.seed, request.messages, request.tools);
    } catch (error) {
      if (error instanceof ProviderRequestError) this.faults.rejected += 1;
      throw error;
    }

    let content = turn.content;
    let finishReason: ChatResponse['finishReason'] = turn.toolCalls.length > 0 ? 'tool_calls' : 'stop';
    const maxOutputTokens = request.maxOutputTokens;
    if (turn.toolCalls.length === 0 && content !== null && maxOutputTokens !== undefined && estimateTokens(content) > maxOutputTokens) {
      content = content.slice(0, maxOutputTokens * 4);
      finishReason = 'length';
    }
    if (request.onText !== undefined) await this.stream(request, request.onText, content);
    const outputTokens = estimateTokens((content ?? '') + turn.toolCalls.map((call) => call.id + call.name + call.arguments).join(''));
    this.responses += 1;
    return {
      message: turn.toolCalls.length > 0 ? { role: 'assistant', content, toolCalls: turn.toolCalls } : { role: 'assistant', content },
      finishReason,
      usage: { inputTokens, outputTokens },
      costUsd: (inputTokens / 1000) * settings.inputUsdPer1kTokens + (outputTokens / 1000) * settings.outputUsdPer1kTokens,
    };
  }

  /**
   * Waits the simulated latency (or the given share of it); an answer slower than the caller's
   * limit is a timeout at that limit, as with a real client.
   */
  private async latency(request: ChatRequest, share = 1): Promise<void> {
    const latencyMs = this.settings.latencyMs;
    const limitMs = callerLimitMs(request);
    if (latencyMs > limitMs) {
      await this.sleep(limitMs, request.signal);
      this.faults.timeout += 1;
      throw new ProviderTimeoutError(`Offline simulator: no answer within ${limitMs} ms (the answer takes ${latencyMs} ms)`);
    }
    if (latencyMs * share > 0) await this.sleep(latencyMs * share, request.signal);
  }

  /** Shows the answer's text growing over the rest of the latency, in STREAM_PIECES steps at word boundaries. */
  private async stream(request: ChatRequest, onText: (textSoFar: string) => void, content: string | null): Promise<void> {
    const pieceMs = (this.settings.latencyMs * (1 - STREAM_DECIDED_AT)) / STREAM_PIECES;
    for (let piece = 1; piece <= STREAM_PIECES; piece += 1) {
      if (pieceMs > 0) await this.sleep(pieceMs, request.signal);
      if (content === null || content === '') continue;
      const cut = piece === STREAM_PIECES ? content.length : content.lastIndexOf(' ', Math.ceil((content.length * piece) / STREAM_PIECES));
      if (cut <= 0) continue;
      try {
        onText(content.slice(0, cut));
      } catch {
        // Showing a draft must never cost the answer.
      }
    }
  }

  /** 0 the first time this instance sees a request, 1 the second, ... */
  private nextAttempt(key: string): number {
    const attempt = this.attempts.get(key) ?? 0;
    this.attempts.delete(key);
    this.attempts.set(key, attempt + 1);
    if (this.attempts.size > MAX_REMEMBERED_REQUESTS) {
      const oldest = this.attempts.keys().next();
      if (oldest.done !== true) this.attempts.delete(oldest.value);
    }
    return attempt;
  }
}

/** The offline provider. Settings are validated here (TerminalError `invalid_input` on nonsense). */
export function createOfflineProvider(options: OfflineProviderOptions): OfflineProvider {
  return new OfflineProviderImpl(options.seed, parseOfflineSettings(options.settings ?? {}), options.clock, options.sleep ?? realSleep);
}
