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
 * holder has been silent `takeoverAfterMs` (a redelivered task's stale-heartbeat takeover comes
 * first; the lease's expiry and the sweeper come later), so that is the holder's own limit, measured
 * on its local clock from a renewal time taken before the renewal was sent (a late answer never
 * moves the limit past what the store saw).
 */
export class LeaseGuard {
  private confirmedAtMs: number;

  constructor(
    private readonly clock: Clock,
    private readonly takeoverAfterMs: number,
    claimedAtMs: number,
  ) {
    if (!Number.isFinite(takeoverAfterMs) || takeoverAfterMs <= 0) throw new Error(`takeoverAfterMs must be a positive number, got ${takeoverAfterMs}`);
    this.confirmedAtMs = claimedAtMs;
  }

  /** A renewal stamped `renewedAtMs` (before it was sent) committed. Older answers leave a newer one alone. */
  confirm(renewedAtMs: number): void {
    this.confirmedAtMs = Math.max(this.confirmedAtMs, renewedAtMs);
  }

  /** The local time after which this holder starts nothing. */
  get deadlineMs(): number {
    return this.confirmedAtMs + this.takeoverAfterMs;
  }

  /** Why the holder must stop now, or null while its last confirmed renewal still covers it. */
  lapse(): LeaseLapsedError | null {
    const silentMs = this.clock.now() - this.confirmedAtMs;
    // A takeover may happen at exactly this age (core/lifecycle.ts decideStaleTakeover): stop there too.
    if (silentMs < this.takeoverAfterMs) return null;
    return new LeaseLapsedError(`no renewal confirmed for ${Math.round(silentMs / 1000)} s (another worker may take over after ${this.takeoverAfterMs / 1000} s): starting nothing more`);
  }
}

/**
 * Makes `controller`'s signal ask `lapse` on every read of `aborted` and every `throwIfAborted()`,
 * aborting the controller with its error first. The signal stays the same object (listeners, `reason`,
 * fetch's own use of it are untouched): only those two reads gain the check.
 */
export function abortOnLapse(controller: AbortController, lapse: () => Error | null): AbortSignal {
  const { signal } = controller;
  const nativeAborted = (): boolean => abortedAlready(signal);
  const check = (): void => {
    if (nativeAborted()) return;
    const error = lapse();
    if (error !== null) controller.abort(error);
  };
  Object.defineProperties(signal, {
    aborted: {
      configurable: true,
      get: () => {
        check();
        return nativeAborted();
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

/** Whether `signal` has been aborted, without running a check `abortOnLapse` added. */
export function abortedAlready(signal: AbortSignal): boolean {
  return Reflect.get<AbortSignal, 'aborted'>(AbortSignal.prototype, 'aborted', signal);
}
