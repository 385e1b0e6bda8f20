/**
 * The pure state-machine decisions (claim, backoff, error handling, expired leases) and the error
 * classes that carry retry intent. Time and randomness are passed in; nothing here sleeps.
 */
import { seededRandom, type RandomSource } from '../../functions/src/core/clock';
import {
  CheckpointWriteError,
  CorruptCheckpointError,
  describeError,
  OwnershipLostError,
  PhaselineError,
  RetryableError,
  RetryAfterError,
  TerminalError,
  toPhaselineError,
} from '../../functions/src/core/errors';
import { JOB_STATUSES, newQueuedJob, type JobRecord } from '../../functions/src/core/job';
import { backoffDelayMs, decideAfterError, decideClaim, decideExpiredLease, endedAtMs, expireAtMs, withRetentionDue } from '../../functions/src/core/lifecycle';
import { DEFAULT_ENGINE_OPTIONS, resolveEngineOptions } from '../../functions/src/core/options';

const NOW = Date.UTC(2026, 2, 1, 12, 0, 0);
/** The largest double below 1: the top of what a RandomSource may return. */
const ALMOST_ONE = 1 - Number.EPSILON;

const constant =
  (value: number): RandomSource =>
  () =>
    value;

function job(overrides: Partial<JobRecord> = {}): JobRecord {
  const request = { id: 'job-1', owner: 'user-1', pipeline: 'two-phase', input: { sections: 3 }, conversationId: null, idempotencyKey: null };
  return { ...newQueuedJob(request, NOW - 60_000), nextRunAtMs: NOW, eventSeq: 0, ...overrides };
}

describe('decideClaim', () => {
  test('a queued job at the task step whose nextRunAt has passed is claimable', () => {
    expect(decideClaim(job({ step: 2, nextRunAtMs: NOW - 1 }), 2, NOW)).toEqual({ claimable: true });
  });

  test('a job due exactly now is claimable', () => {
    expect(decideClaim(job({ nextRunAtMs: NOW }), 0, NOW)).toEqual({ claimable: true });
  });

  test('a task for another step is refused and the reason names both steps', () => {
    const decision = decideClaim(job({ step: 3 }), 2, NOW);
    expect(decision.claimable).toBe(false);
    if (decision.claimable) return;
    expect(decision.reason).toContain('step 2');
    expect(decision.reason).toContain('step 3');
    expect(decision.notYetDueMs).toBeUndefined();
  });

  test.each(JOB_STATUSES.filter((status) => status !== 'queued'))('a %s job is not claimable, even when due and at the step', (status) => {
    const decision = decideClaim(job({ status, step: 1, nextRunAtMs: NOW - 1_000 }), 1, NOW);
    expect(decision).toEqual({ claimable: false, reason: `job is ${status}` });
  });

  test('a job that is backing off is refused with the time left until it is due', () => {
    const decision = decideClaim(job({ nextRunAtMs: NOW + 4_321 }), 0, NOW);
    expect(decision).toEqual({ claimable: false, reason: 'job is backing off', notYetDueMs: 4_321 });
  });
});

describe('backoffDelayMs (full jitter)', () => {
  const options = resolveEngineOptions({ backoffBaseSeconds: 5, backoffMaxSeconds: 600 });

  test('random() = 0 gives no delay', () => {
    expect(backoffDelayMs(1, options, constant(0))).toBe(0);
    expect(backoffDelayMs(6, options, constant(0))).toBe(0);
  });

  test('random() = 0 with a retry-after waits exactly the retry-after', () => {
    expect(backoffDelayMs(1, options, constant(0), 7_500)).toBe(7_500);
  });

  test('random() near 1 gives just under the ceiling', () => {
    expect(backoffDelayMs(1, options, constant(ALMOST_ONE))).toBe(4_999);
    const nearTop = backoffDelayMs(1, options, constant(0.999));
    expect(nearTop).toBeLessThan(5_000);
    expect(nearTop).toBeGreaterThanOrEqual(4_990);
  });

  test.each([
    [1, 5_000],
    [2, 10_000],
    [3, 20_000],
    [4, 40_000],
    [5, 80_000],
    [6, 160_000],
    [7, 320_000],
    [8, 600_000],
    [9, 600_000],
    [40, 600_000],
  ])('the ceiling for attempt %i is %i ms (doubling, capped at backoffMaxSeconds)', (attempt, ceilingMs) => {
    expect(backoffDelayMs(attempt, options, constant(ALMOST_ONE))).toBe(ceilingMs - 1);
    expect(backoffDelayMs(attempt, options, constant(0.5))).toBe(ceilingMs / 2);
  });

  test('attempt 0 (or less) uses the base ceiling', () => {
    expect(backoffDelayMs(0, options, constant(ALMOST_ONE))).toBe(4_999);
    expect(backoffDelayMs(-3, options, constant(ALMOST_ONE))).toBe(4_999);
  });

  test('a smaller cap takes effect', () => {
    const capped = resolveEngineOptions({ backoffBaseSeconds: 1, backoffMaxSeconds: 3 });
    expect(backoffDelayMs(2, capped, constant(ALMOST_ONE))).toBe(1_999);
    expect(backoffDelayMs(3, capped, constant(ALMOST_ONE))).toBe(2_999);
    expect(backoffDelayMs(10, capped, constant(ALMOST_ONE))).toBe(2_999);
  });

  test('never sooner than the retry-after, even when the jitter draws more or less', () => {
    expect(backoffDelayMs(1, options, constant(ALMOST_ONE), 30_000)).toBe(30_000);
    expect(backoffDelayMs(1, options, constant(ALMOST_ONE), 1_000)).toBe(4_999);
    const random = seededRandom(42);
    const delays = Array.from({ length: 500 }, (_, draw) => backoffDelayMs(1 + (draw % 10), options, random, 2_500));
    expect(Math.min(...delays)).toBe(2_500);
  });

  test('seeded draws are whole milliseconds in [0, ceiling) and actually spread out', () => {
    const random = seededRandom(7);
    const delays = Array.from({ length: 1_000 }, () => backoffDelayMs(3, options, random));
    expect(delays.filter((delay) => !Number.isInteger(delay) || delay < 0 || delay >= 20_000)).toEqual([]);
    expect(Math.min(...delays)).toBeLessThan(2_000);
    expect(Math.max(...delays)).toBeGreaterThan(18_000);
  });
});

describe('decideAfterError', () => {
  const options = resolveEngineOptions({ maxAttempts: 5, backoffBaseSeconds: 5, backoffMaxSeconds: 600 });

  test('a terminal error fails the job at once, counting the attempt', () => {
    const random = jest.fn(constant(0.5));
    const decision = decideAfterError(job({ status: 'running', attempts: 0 }), new TerminalError('bad request'), options, NOW, random);
    expect(decision).toEqual({ action: 'fail', attempts: 1, reason: 'terminal error (terminal)' });
    expect(random).not.toHaveBeenCalled();
  });

  test('the terminal reason names the specific code', () => {
    const decision = decideAfterError(job({ status: 'running', attempts: 2 }), new CorruptCheckpointError('bad state'), options, NOW, constant(0));
    expect(decision).toEqual({ action: 'fail', attempts: 3, reason: 'terminal error (corrupt_checkpoint)' });
  });

  test('a retryable error with budget left requeues with nextRunAt = now + backoff', () => {
    const decision = decideAfterError(job({ status: 'running', attempts: 1 }), new RetryableError('flaky'), options, NOW, constant(0.5));
    // attempts becomes 2: ceiling 10 s, half of it drawn.
    expect(decision).toEqual({ action: 'requeue', attempts: 2, nextRunAtMs: NOW + 5_000 });
  });

  test('the requeue delay agrees with backoffDelayMs for the new attempt count', () => {
    const decision = decideAfterError(job({ status: 'running', attempts: 2 }), new RetryableError('flaky'), options, NOW, constant(ALMOST_ONE));
    expect(decision).toEqual({ action: 'requeue', attempts: 3, nextRunAtMs: NOW + backoffDelayMs(3, options, constant(ALMOST_ONE)) });
    expect(decision.action === 'requeue' && decision.nextRunAtMs).toBe(NOW + 19_999);
  });

  test('a rate-limit error waits at least its retry-after', () => {
    const decision = decideAfterError(job({ status: 'running' }), new RetryAfterError('slow down', 45_000), options, NOW, constant(0));
    expect(decision).toEqual({ action: 'requeue', attempts: 1, nextRunAtMs: NOW + 45_000 });
  });

  test('an unknown error (classified as internal) is retried', () => {
    const decision = decideAfterError(job({ status: 'running' }), toPhaselineError(new Error('socket hang up')), options, NOW, constant(0));
    expect(decision).toEqual({ action: 'requeue', attempts: 1, nextRunAtMs: NOW });
  });

  test('the last attempt that still has budget is requeued', () => {
    const decision = decideAfterError(job({ status: 'running', attempts: 3 }), new RetryableError('flaky'), options, NOW, constant(0));
    expect(decision.action).toBe('requeue');
    expect(decision.attempts).toBe(4);
  });

  test('reaching maxAttempts fails the job with a reason naming the counts', () => {
    const decision = decideAfterError(job({ status: 'running', attempts: 4 }), new RetryableError('flaky'), options, NOW, constant(0));
    expect(decision).toEqual({ action: 'fail', attempts: 5, reason: 'retry budget spent (5 of 5 attempts)' });
  });

  test('a retry-after does not buy budget beyond maxAttempts', () => {
    const small = resolveEngineOptions({ maxAttempts: 2 });
    const decision = decideAfterError(job({ status: 'running', attempts: 1 }), new RetryAfterError('later', 1_000), small, NOW, constant(0));
    expect(decision.action).toBe('fail');
    expect(decision.action === 'fail' && decision.reason).toMatch(/2 of 2/);
  });
});

describe('decideExpiredLease', () => {
  const options = resolveEngineOptions({ maxStaleReclaims: 3 });

  test.each([0, 1, 2])('with %i stale reclaims so far, the job is requeued and the count goes up', (before) => {
    expect(decideExpiredLease(job({ status: 'running', staleReclaims: before }), options)).toEqual({ action: 'requeue', staleReclaims: before + 1 });
  });

  test('one expiry past the limit quarantines the job with a reason', () => {
    const decision = decideExpiredLease(job({ status: 'running', staleReclaims: 3 }), options);
    expect(decision.action).toBe('quarantine');
    expect(decision.staleReclaims).toBe(4);
    if (decision.action !== 'quarantine') return;
    expect(decision.reason).toContain('4 times');
    expect(decision.reason).toContain('limit 3');
  });

  test('a limit of zero quarantines on the first expiry', () => {
    const decision = decideExpiredLease(job({ status: 'running' }), resolveEngineOptions({ maxStaleReclaims: 0 }));
    expect(decision.action).toBe('quarantine');
    expect(decision.staleReclaims).toBe(1);
  });

  test('the default limit is the one in DEFAULT_ENGINE_OPTIONS', () => {
    const limit = DEFAULT_ENGINE_OPTIONS.maxStaleReclaims;
    expect(decideExpiredLease(job({ staleReclaims: limit - 1 }), DEFAULT_ENGINE_OPTIONS).action).toBe('requeue');
    expect(decideExpiredLease(job({ staleReclaims: limit }), DEFAULT_ENGINE_OPTIONS).action).toBe('quarantine');
  });
});

describe('error classes', () => {
  test.each([
    ['RetryableError', new RetryableError('m'), 'retryable', true],
    ['RetryAfterError', new RetryAfterError('m', 1_500), 'rate_limited', true],
    ['TerminalError', new TerminalError('m'), 'terminal', false],
    ['OwnershipLostError', new OwnershipLostError('m'), 'ownership_lost', false],
    ['CheckpointWriteError', new CheckpointWriteError('m'), 'checkpoint_write_failed', true],
    ['CorruptCheckpointError', new CorruptCheckpointError('m'), 'corrupt_checkpoint', false],
  ] as const)('%s has its code and retry flag, and its own name', (name, error, code, retryable) => {
    expect(error).toBeInstanceOf(PhaselineError);
    expect(error).toBeInstanceOf(Error);
    expect(error.code).toBe(code);
    expect(error.retryable).toBe(retryable);
    expect(error.name).toBe(name);
    expect(error.message).toBe('m');
  });

  test('the class hierarchy follows the retry intent', () => {
    expect(new RetryAfterError('m', 1)).toBeInstanceOf(RetryableError);
    expect(new CheckpointWriteError('m')).toBeInstanceOf(RetryableError);
    expect(new CorruptCheckpointError('m')).toBeInstanceOf(TerminalError);
    expect(new OwnershipLostError('m')).not.toBeInstanceOf(TerminalError);
    expect(new OwnershipLostError('m')).not.toBeInstanceOf(RetryableError);
  });

  test('RetryAfterError carries retryAfterMs; others have none unless given', () => {
    expect(new RetryAfterError('m', 12_000).retryAfterMs).toBe(12_000);
    expect(new RetryableError('m').retryAfterMs).toBeUndefined();
    expect(new RetryableError('m', { retryAfterMs: 300 }).retryAfterMs).toBe(300);
    expect(new TerminalError('m').retryAfterMs).toBeUndefined();
  });

  test('RetryableError and TerminalError accept a more specific code', () => {
    const unavailable = new RetryableError('down', { code: 'provider_unavailable' });
    expect(unavailable.code).toBe('provider_unavailable');
    expect(unavailable.retryable).toBe(true);
    const invalid = new TerminalError('bad', { code: 'invalid_input' });
    expect(invalid.code).toBe('invalid_input');
    expect(invalid.retryable).toBe(false);
  });

  test('a cause is kept when given and absent otherwise', () => {
    const root = new Error('ECONNRESET');
    expect(new CheckpointWriteError('write failed', root).cause).toBe(root);
    expect(new CorruptCheckpointError('bad', root).cause).toBe(root);
    expect(new RetryAfterError('later', 10, { cause: root }).cause).toBe(root);
    expect(new TerminalError('m', { cause: 'text cause' }).cause).toBe('text cause');
    expect('cause' in new RetryableError('m')).toBe(false);
    expect('cause' in new CheckpointWriteError('m')).toBe(false);
  });
});

describe('toPhaselineError', () => {
  test('returns a PhaselineError unchanged', () => {
    const terminal = new TerminalError('nope');
    const rateLimited = new RetryAfterError('wait', 2_000);
    expect(toPhaselineError(terminal)).toBe(terminal);
    expect(toPhaselineError(rateLimited)).toBe(rateLimited);
  });

  test('wraps a plain Error as a retryable internal error with the cause', () => {
    const original = new TypeError('cannot read properties of undefined');
    const wrapped = toPhaselineError(original);
    expect(wrapped).toBeInstanceOf(RetryableError);
    expect(wrapped.code).toBe('internal');
    expect(wrapped.retryable).toBe(true);
    expect(wrapped.message).toBe('cannot read properties of undefined');
    expect(wrapped.cause).toBe(original);
  });

  test('wraps a thrown non-Error value, stringifying it for the message', () => {
    const wrapped = toPhaselineError('plain string');
    expect(wrapped.code).toBe('internal');
    expect(wrapped.retryable).toBe(true);
    expect(wrapped.message).toBe('plain string');
    expect(wrapped.cause).toBe('plain string');
    const fromObject = { status: 503 };
    expect(toPhaselineError(fromObject).cause).toBe(fromObject);
    expect(toPhaselineError(42).message).toBe('42');
  });

  test('describeError names the class of an Error', () => {
    expect(describeError(new TerminalError('bad input'))).toBe('TerminalError: bad input');
    expect(describeError('just text')).toBe('just text');
  });
});

describe('retention', () => {
  const ended = (status: JobRecord['status'], overrides: Partial<JobRecord> = {}): JobRecord => ({ ...newQueuedJob({ id: 'j', owner: 'o', pipeline: 'p', input: {}, conversationId: null, idempotencyKey: null }, 0), status, ...overrides });

  test('a document expires retentionDays after its job ended', () => {
    expect(expireAtMs(1_000, 30)).toBe(1_000 + 30 * 86_400_000);
    expect(endedAtMs(ended('completed', { finishedAtMs: 5_000, updatedAtMs: 9_000 }))).toBe(5_000);
    expect(endedAtMs(ended('completed', { finishedAtMs: null, retention: { dueAtMs: 7_000, cursor: null }, updatedAtMs: 9_000 }))).toBe(7_000);
  });

  test('a commit into completed, failed or cancelled makes the stamping due at the finish time, once', () => {
    for (const status of ['completed', 'failed', 'cancelled'] as const) {
      expect(withRetentionDue(ended('running'), ended(status, { finishedAtMs: 4_000 }), 9_000).retention).toEqual({ dueAtMs: 4_000, cursor: null });
    }
    // A record built without a finish time still gets a due time: the commit's.
    expect(withRetentionDue(ended('running'), ended('failed', { finishedAtMs: null }), 9_000).retention).toEqual({ dueAtMs: 9_000, cursor: null });
    // A later commit of an ended job (an effects check, the sweeper's cursor) leaves the marker as it is.
    const cleared = ended('cancelled', { finishedAtMs: 4_000, retention: null });
    expect(withRetentionDue(cleared, cleared, 9_000).retention).toBeNull();
    const halfway = ended('completed', { finishedAtMs: 4_000, retention: { dueAtMs: 4_000, cursor: 'events/j00000009' } });
    expect(withRetentionDue(ended('running'), halfway, 9_000).retention).toEqual({ dueAtMs: 4_000, cursor: 'events/j00000009' });
  });

  test('quarantined, waiting and running jobs have not ended: no stamping', () => {
    for (const status of ['queued', 'running', 'waiting', 'quarantined'] as const) {
      expect(withRetentionDue(ended('running'), ended(status, { finishedAtMs: 4_000 }), 9_000).retention).toBeNull();
    }
  });

  test('retentionDays must be positive', () => {
    expect(resolveEngineOptions().retentionDays).toBe(30);
    expect(() => resolveEngineOptions({ retentionDays: 0 })).toThrow(/retentionDays must be positive/);
  });
});
