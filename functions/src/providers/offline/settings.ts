/**
 * Offline simulator settings
 * ==========================
 *
 * One zod-validated object configures every simulated behaviour of the offline provider and its
 * corpus toolbox. Every field is optional; `parseOfflineSettings({})` gives the defaults below,
 * which describe a fast, healthy, free provider. The same object can come from JSON (for example
 * an environment variable) through `parseOfflineSettingsJson`.
 *
 * | field                    | default | meaning                                                         |
 * |--------------------------|---------|-----------------------------------------------------------------|
 * | `latencyMs`              | 0       | fixed wait per provider call, awaited through the injected sleep |
 * | `timeoutMs`              | 10000   | how long a simulated timeout waits before it throws             |
 * | `epochMs`                | 0       | clock time (ms since 1970) that `errorWaves` are measured from  |
 * | `errorWaves`             | []      | windows `{ startMs, endMs, status: 429 or 503, retryAfterMs? }`  |
 * | `timeoutRate`            | 0       | share of calls that end in ProviderTimeoutError                 |
 * | `malformedRate`          | 0       | share of calls that end in MalformedResponseError               |
 * | `partialToolResultsRate` | 0       | share of 2nd+ calls of a multi-call group the toolbox interrupts |
 * | `contextWindowTokens`    | 128000  | requests estimated above it throw ContextWindowError            |
 * | `inputUsdPer1kTokens`    | 0       | simulated price, so benchmarks can show a cost                  |
 * | `outputUsdPer1kTokens`   | 0       | simulated price of output tokens                                |
 * | `toolExecutionLog`       | unset   | test instrumentation: a file the toolbox appends one JSON line  |
 * |                          |         | to per tool execution (execution-log.ts; the chaos soak)        |
 *
 * Error waves. A wave is active while `startMs <= clock.now() - epochMs < endMs`; every call made
 * during it fails with 429 (ProviderRateLimitedError, carrying `retryAfterMs` when given) or 503
 * (ProviderUnavailableError). Waves depend only on the injected clock, so every worker in every
 * process sees the same outage at the same moment, as with a real shared provider.
 *
 * Rates. Whether a call times out or is malformed is drawn from (seed, a hash of the request, how
 * many times this provider instance has seen that exact request). A run therefore replays exactly
 * with the same seed, and a retry of the same request gets a fresh draw: a rate below 1 never
 * makes one request fail forever. Partial tool results are drawn the same way from (seed, call ID,
 * executions of that call ID).
 *
 * The caller's limit. A request's `timeoutMs` (what is left of the caller's step) bounds every
 * wait: an answer whose latency, or a simulated timeout whose `timeoutMs`, is longer waits only
 * that limit and then throws ProviderTimeoutError, as a real client's timeout would.
 *
 * Costs are simulated: no money is spent and the prices are not any real provider's. Token counts
 * are estimated at four characters a token.
 */
import { z } from 'zod';
import { TerminalError } from '../../core/errors';

const rate = z.number().min(0).max(1);
const nonNegativeMs = z.number().int().min(0);

export const errorWaveSchema = z
  .strictObject({
    /** Start of the window, in ms after `epochMs` (inclusive). */
    startMs: nonNegativeMs,
    /** End of the window, in ms after `epochMs` (exclusive). */
    endMs: nonNegativeMs,
    status: z.union([z.literal(429), z.literal(503)]),
    /** The Retry-After hint the simulated provider gives during this wave. */
    retryAfterMs: nonNegativeMs.optional(),
  })
  .refine((wave) => wave.endMs > wave.startMs, { message: 'endMs must be after startMs', path: ['endMs'] });

export const offlineSettingsSchema = z.strictObject({
  latencyMs: nonNegativeMs.max(600_000).default(0),
  timeoutMs: nonNegativeMs.max(3_600_000).default(10_000),
  epochMs: nonNegativeMs.default(0),
  errorWaves: z.array(errorWaveSchema).max(100).default([]),
  timeoutRate: rate.default(0),
  malformedRate: rate.default(0),
  partialToolResultsRate: rate.default(0),
  contextWindowTokens: z.number().int().min(256).max(10_000_000).default(128_000),
  inputUsdPer1kTokens: z.number().min(0).max(1_000).default(0),
  outputUsdPer1kTokens: z.number().min(0).max(1_000).default(0),
  toolExecutionLog: z.string().min(1).max(4_096).optional(),
});

export type ErrorWave = z.output<typeof errorWaveSchema>;
export type OfflineSettings = Readonly<z.output<typeof offlineSettingsSchema>>;
/** What callers write: every field optional. */
export type OfflineSettingsInput = z.input<typeof offlineSettingsSchema>;

export const DEFAULT_OFFLINE_SETTINGS: OfflineSettings = offlineSettingsSchema.parse({});

/** Validates settings and fills in defaults; throws a TerminalError (`invalid_input`) naming every problem. */
export function parseOfflineSettings(input: unknown): OfflineSettings {
  const parsed = offlineSettingsSchema.safeParse(input ?? {});
  if (!parsed.success) {
    throw new TerminalError(`Invalid offline provider settings:\n${z.prettifyError(parsed.error)}`, { code: 'invalid_input' });
  }
  return parsed.data;
}

/** Settings from JSON text (an environment variable, say); blank or absent text gives the defaults. */
export function parseOfflineSettingsJson(text: string | undefined): OfflineSettings {
  if (text === undefined || text.trim() === '') return DEFAULT_OFFLINE_SETTINGS;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new TerminalError('Invalid offline provider settings: not valid JSON', { code: 'invalid_input', cause: error });
  }
  return parseOfflineSettings(value);
}

/** The wave active at `nowMs`, if any (the first listed wins when windows overlap). */
export function activeErrorWave(settings: OfflineSettings, nowMs: number): ErrorWave | undefined {
  const offsetMs = nowMs - settings.epochMs;
  return settings.errorWaves.find((wave) => offsetMs >= wave.startMs && offsetMs < wave.endMs);
}
