/**
 * The holder's own view of its lease: when did it last *confirm* a renewal, and may it still start
 * work? A worker that was frozen (process stopped, event loop blocked) wakes with answers already in
 * its sockets; their callbacks run before any timer, so a timer alone would let it start a model or
 * tool call that a later claim may already have recorded. The check here runs synchronously on every
 * read of the signal a step's calls get (StepContext.signal), which every call site consults before
 * it starts a call. The store's writes need no such check: the door fences them.
 */
import type { Clock } from './clock';
import { OwnershipLostError } from './errors';

/** The holder's claim may already belong to someone else: it starts nothing more and stops. */
export class LeaseLapsedError extends OwnershipLostError {
  constructor(message: string) {
    super(message);
    this.name = 'LeaseLapsedError';
  }
}

/**
 * Tracks the last confirmed renewal of one claim. Another worker may take the claim over once the
 * holder has been silent the takeover age *on the taker's clock* (a redelivered task's stale-heartbeat
 * takeover comes first; the lease's expiry and the sweeper come later), so the holder stops
 * `stopAfterMs` after it, on its own clock: at least the clock-skew allowance before any taker may
 * decide (core/options.ts holderStopAgeMs and takeoverAgeMs, where the bound is argued). Both count from the same stamp, taken
 * before the renewal was sent, so a late answer never moves the limit past what the store saw.
 */
export class LeaseGuard {
  private confirmedAtMs: number;

  constructor(
    private readonly clock: Clock,
    private readonly stopAfterMs: number,
    claimedAtMs: number,
  ) {
    if (!Number.isFinite(stopAfterMs) || stopAfterMs <= 0) throw new Error(`stopAfterMs must be a positive number, got ${stopAfterMs}`);
    this.confirmedAtMs = claimedAtMs;
  }

  /** A renewal stamped `renewedAtMs` (before it was sent) committed. Older answers leave a newer one alone. */
  confirm(renewedAtMs: number): void {
    this.confirmedAtMs = Math.max(this.confirmedAtMs, renewedAtMs);
  }

  /** The local time after which this holder starts nothing. */
  get deadlineMs(): number {
    return this.confirmedAtMs + this.stopAfterMs;
  }

  /** Why the holder must stop now, or null while its last confirmed renewal still covers it. */
  lapse(): LeaseLapsedError | null {
    const silentMs = this.clock.now() - this.confirmedAtMs;
    // At exactly this age a taker whose clock is ahead by the full allowance may take over: stop there too.
    if (silentMs < this.stopAfterMs) return null;
    return new LeaseLapsedError(
      `no renewal confirmed for ${Math.round(silentMs / 1000)} s (this holder stops at ${this.stopAfterMs / 1000} s, before another worker may take over): starting nothing more`,
    );
  }
}

/**
 * Makes `controller`'s signal ask `lapse` on every read of `aborted` and every `throwIfAborted()`,
 * aborting the controller with its error first. The signal stays the same object (listeners, `reason`,
 * fetch's own use of it are untouched): only those two reads gain the check.
 */
export function abortOnLapse(controller: AbortController, lapse: () => Error | null): AbortSignal {
  const { signal } = controller;
  return checkedOnRead(signal, () => {
    if (abortedAlready(signal)) return;
    const error = lapse();
    if (error !== null) controller.abort(error);
  });
}

/**
 * `AbortSignal.any([checked, other])` that keeps `checked`'s checks: every read of its `aborted` and
 * `throwIfAborted()` reads `checked.aborted` first. A plainly combined signal learns of a lapse only
 * once something else reads `checked`, so a call that looks at it before it starts would start.
 */
export function anyKeepingChecks(checked: AbortSignal, other: AbortSignal): AbortSignal {
  const combined = AbortSignal.any([checked, other]);
  return checkedOnRead(combined, () => {
    // An abort this read makes reaches `combined` at once, with its reason: AbortSignal.any follows its sources synchronously.
    if (!abortedAlready(combined)) readAborted(checked);
  });
}

function checkedOnRead(signal: AbortSignal, check: () => void): AbortSignal {
  Object.defineProperties(signal, {
    aborted: {
      configurable: true,
      get: () => {
        check();
        return abortedAlready(signal);
      },
    },
    throwIfAborted: {
      configurable: true,
      value: () => {
        check();
        AbortSignal.prototype.throwIfAborted.call(signal);
      },
    },
  });
  return signal;
}

/** Reads `signal.aborted`, running whatever check a getter on it adds. */
function readAborted(signal: AbortSignal): boolean {
  return signal.aborted;
}

/** Whether `signal` has been aborted, without running a check `abortOnLapse` added. */
export function abortedAlready(signal: AbortSignal): boolean {
  return Reflect.get<AbortSignal, 'aborted'>(AbortSignal.prototype, 'aborted', signal);
}
