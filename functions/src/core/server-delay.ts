/**
 * Delays a server gives us (`Retry-After`, a provider's reset hint) are advice from outside: they
 * are parsed once here and capped before anything schedules on them. A delay past the cap is not
 * honoured as a backoff; callers treat it as an outage with a resume time of `nowMs + capMs`.
 */

/** Default cap on any server-given delay: 15 minutes (engine option `maxServerDelaySeconds`). */
export const DEFAULT_MAX_SERVER_DELAY_SECONDS = 900;

/**
 * `Retry-After` as milliseconds from now: delta-seconds (`"7"`, `"1.5"`) or an HTTP date. A date
 * in the past gives 0; anything unreadable, negative or not finite gives null. The value is raw
 * (uncapped) but always a finite, non-negative safe integer.
 */
export function parseRetryAfter(value: string | null | undefined, nowMs: number): number | null {
  if (value === null || value === undefined) return null;
  const text = value.trim();
  if (text === '') return null;
  if (/^\d+(\.\d+)?$/.test(text)) return clampToSafe(Number(text) * 1000);
  const dateMs = Date.parse(text);
  if (!Number.isFinite(dateMs)) return null;
  return clampToSafe(dateMs - nowMs);
}

function clampToSafe(ms: number): number | null {
  if (Number.isNaN(ms)) return null;
  return Math.round(Math.min(Math.max(0, ms), Number.MAX_SAFE_INTEGER));
}

/** A server-given delay after the cap: what to schedule on, what was asked for, and whether the cap cut it. */
export interface CappedDelay {
  /** The delay to schedule on: never more than the cap. */
  readonly delayMs: number;
  /** What the server asked for (finite, non-negative). */
  readonly requestedMs: number;
  /** True when the server asked for more than the cap: treat it as an outage, resume at the cap. */
  readonly capped: boolean;
}

/** Caps a server-given delay. NaN, negative or missing counts as no delay. */
export function capServerDelay(requestedMs: number | null | undefined, capMs: number): CappedDelay {
  // Infinity is a server saying "not in any time we could schedule": an outage past the cap.
  const requested = typeof requestedMs === 'number' && requestedMs > 0 ? requestedMs : 0;
  if (requested > capMs) return { delayMs: capMs, requestedMs: requested, capped: true };
  return { delayMs: requested, requestedMs: requested, capped: false };
}
