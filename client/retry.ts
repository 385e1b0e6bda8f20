/**
 * When a call to the functions is tried again, as pure decisions over an injected clock and
 * random source (test/unit/frontend-client.test.ts runs them without a real sleep).
 *
 * Tried again: a network failure (the request may or may not have arrived), a 5xx, and a 429 or
 * 503 after the server's `Retry-After` (capped). Never again: any other 4xx (the same request would
 * be refused the same way), and a 429 `quota_exceeded`, which is the person's own limit: it frees
 * when a job ends, a minute passes or a day turns, so it is shown at once with its time to retry.
 */

/** Time for the retry loop: what time it is (for an HTTP-date `Retry-After`) and a wait that an abort ends early. */
export interface RetryClock {
  now(): number;
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

/** The real clock: `Date.now()` and `setTimeout`. */
export const systemRetryClock: RetryClock = {
  now: () => Date.now(),
  sleep: (ms, signal) =>
    new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason as Error);
        return;
      }
      const onAbort = (): void => {
        clearTimeout(timer);
        reject(signal?.reason as Error);
      };
      const timer = setTimeout(() => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      }, ms);
      signal?.addEventListener('abort', onAbort, { once: true });
    }),
};

/** How many times a call is tried and how long it waits between tries. */
export interface RetryPolicy {
  /** Tries in all, the first included. */
  readonly attempts: number;
  /** The first wait after a failure without `Retry-After`; doubled for each further try. */
  readonly baseDelayMs: number;
  /** The longest wait of the client's own backoff. */
  readonly maxDelayMs: number;
  /** The longest the client waits for a server's `Retry-After`: a longer one is waited for this long. */
  readonly maxRetryAfterMs: number;
}

/** Five tries over about ten seconds; a server's `Retry-After` is honoured up to 30 seconds. */
export const DEFAULT_RETRY_POLICY: RetryPolicy = { attempts: 5, baseDelayMs: 400, maxDelayMs: 5_000, maxRetryAfterMs: 30_000 };

/** What a failed try looked like, as far as retrying is concerned. */
export interface FailedTry {
  /** The HTTP status; 0 when no answer arrived (a network failure). */
  readonly status: number;
  /** The body's `error` code (`quota_exceeded`, `contended`, ...), or `network`. */
  readonly code: string;
  /** The server's wish, in milliseconds from now, if it said (`Retry-After`). */
  readonly retryAfterMs: number | null;
}

/** The error code of a refusal for one of the person's own limits (a 429). */
export const QUOTA_EXCEEDED = 'quota_exceeded';

/** Whether a try that failed this way may succeed later: no answer, a 5xx, or a 429 that is not the person's limit. */
export function isRetryable(failure: Pick<FailedTry, 'status' | 'code'>): boolean {
  if (failure.status === 0 || failure.status >= 500) return true;
  return failure.status === 429 && failure.code !== QUOTA_EXCEEDED;
}

/**
 * How long to wait before try `attempt + 1` after `attempt` failed (attempts count from 1), or
 * null when no further try is made. The server's `Retry-After` wins (capped at
 * `maxRetryAfterMs`); without it, exponential backoff with jitter (half to all of the step).
 */
export function retryDelayMs(failure: FailedTry, attempt: number, policy: RetryPolicy = DEFAULT_RETRY_POLICY, random: () => number = Math.random): number | null {
  if (attempt >= policy.attempts || !isRetryable(failure)) return null;
  if (failure.retryAfterMs !== null) return Math.min(Math.max(0, failure.retryAfterMs), policy.maxRetryAfterMs);
  const step = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** (attempt - 1));
  return Math.round(step * (0.5 + random() / 2));
}

/**
 * A `Retry-After` header in milliseconds from `nowMs`: delay-seconds or an HTTP-date (RFC 9110);
 * null when absent or unreadable.
 */
export function parseRetryAfter(header: string | null, nowMs: number): number | null {
  if (header === null) return null;
  const value = header.trim();
  if (/^\d+$/.test(value)) return Number(value) * 1000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, at - nowMs);
}
