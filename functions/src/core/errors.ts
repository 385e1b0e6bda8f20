/**
 * Retry intent lives in error types with codes, never in message matching.
 * `retryable` errors requeue the job within its attempt budget; terminal ones fail it at once.
 */
export type ErrorCode =
  | 'retryable'
  | 'rate_limited'
  | 'provider_unavailable'
  | 'timeout'
  | 'checkpoint_write_failed'
  | 'terminal'
  | 'invalid_input'
  | 'corrupt_checkpoint'
  | 'ownership_lost'
  | 'context_window'
  | 'malformed_response'
  | 'provider_rejected'
  | 'budget_exhausted'
  | 'spend_limit'
  | 'internal';

/** Optional details of a PhaselineError: its cause, a server-given delay, money already billed. */
export interface PhaselineErrorOptions {
  readonly cause?: unknown;
  /** For retryable errors: the earliest time a retry makes sense, relative to now. */
  readonly retryAfterMs?: number;
  /** What a failed call was billed all the same (a model answer refused after the provider reported its usage). */
  readonly billedUsd?: number;
}

/** The base of every error Phaseline acts on: a code, and whether a retry can help (the engine reads these, never the message). */
export class PhaselineError extends Error {
  readonly code: ErrorCode;
  readonly retryable: boolean;
  readonly retryAfterMs: number | undefined;
  readonly billedUsd: number | undefined;

  constructor(code: ErrorCode, retryable: boolean, message: string, options: PhaselineErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.retryable = retryable;
    this.retryAfterMs = options.retryAfterMs;
    this.billedUsd = options.billedUsd;
  }
}

/** A failure worth retrying: the job is requeued with backoff while its attempts budget lasts. */
export class RetryableError extends PhaselineError {
  constructor(message: string, options: PhaselineErrorOptions & { readonly code?: ErrorCode } = {}) {
    super(options.code ?? 'retryable', true, message, options);
  }
}

/** A retryable failure whose server said when to come back (Retry-After); the delay is capped. */
export class RetryAfterError extends RetryableError {
  constructor(message: string, retryAfterMs: number, options: PhaselineErrorOptions = {}) {
    super(message, { ...options, code: 'rate_limited', retryAfterMs });
  }
}

/** A failure no retry fixes: the job fails with this message. */
export class TerminalError extends PhaselineError {
  constructor(message: string, options: PhaselineErrorOptions & { readonly code?: ErrorCode } = {}) {
    super(options.code ?? 'terminal', false, message, options);
  }
}

/** The caller no longer holds the claim: a newer owner exists, or the job left `running`. */
export class OwnershipLostError extends PhaselineError {
  constructor(message: string) {
    super('ownership_lost', false, message);
  }
}

/** RetryableError or TerminalError: a family that takes its code from the options. */
type ErrorFamily = new (message: string, options: PhaselineErrorOptions & { readonly code?: ErrorCode }) => PhaselineError;

/** A class of errors with one code, in the retryable or the terminal family, made from a message and what caused it. */
function errorOfCode(family: ErrorFamily, code: ErrorCode) {
  return class extends family {
    constructor(message: string, cause?: unknown) {
      super(message, { code, cause });
    }
  };
}

/** A checkpoint could not be made durable; the step stops and the job is requeued. */
export class CheckpointWriteError extends errorOfCode(RetryableError, 'checkpoint_write_failed') {}

/**
 * The job's owner reached their daily model spend cap: no model call starts. Not a failure of the
 * step (it spends no attempt): the engine turns it into a `budget` wait at the call's boundary.
 */
export class SpendLimitReachedError extends PhaselineError {
  constructor(
    message: string,
    readonly spentUsd: number,
    readonly capUsd: number,
    readonly resetAtMs: number,
  ) {
    super('spend_limit', false, message);
  }
}

/** Stored state failed validation: refused, never trusted. */
export class CorruptCheckpointError extends errorOfCode(TerminalError, 'corrupt_checkpoint') {}

/**
 * A job document the codec refuses: no decision can be made from it, so whatever finds it (its
 * task, a sweep) ends it where it stands, with this reason, instead of trying again
 * (store/unreadable-jobs.ts).
 */
export class UnreadableJobError extends CorruptCheckpointError {
  constructor(
    readonly jobId: string,
    message: string,
  ) {
    super(message);
  }
}

/** Classifies anything thrown into a PhaselineError; unknown errors are retryable (transient until proven otherwise). */
export function toPhaselineError(error: unknown): PhaselineError {
  if (error instanceof PhaselineError) return error;
  const message = error instanceof Error ? error.message : String(error);
  return new RetryableError(message, { code: 'internal', cause: error });
}

/** A one-line description of any thrown value, for logs and timelines. */
export function describeError(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}
