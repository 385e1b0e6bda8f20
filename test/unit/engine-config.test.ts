/**
 * Engine options (one defaults object, validated once), their PHASELINE_* environment variables,
 * the injected clock and random source, and the deterministic task IDs.
 */
import { ManualClock, seededRandom, systemClock } from '../../functions/src/core/clock';
import { stepTaskId, unitTaskId } from '../../functions/src/core/job';
import { DEFAULT_ENGINE_OPTIONS, resolveEngineOptions, type EngineOptions } from '../../functions/src/core/options';
import { engineOptionsFromEnv } from '../../functions/src/triggers/config';

describe('resolveEngineOptions', () => {
  test('the defaults: 20 s lease, 5 s heartbeat, takeover after 10 s without one, 150 s progress bound, 1000 ms progress flush', () => {
    const options = resolveEngineOptions();
    expect(options.leaseSeconds).toBe(20);
    expect(options.heartbeatSeconds).toBe(5);
    expect(options.staleHeartbeatSeconds).toBe(10);
    expect(options.progressTimeoutSeconds).toBe(150);
    expect(options.progressFlushMs).toBe(1_000);
    expect(options).toEqual(DEFAULT_ENGINE_OPTIONS);
  });

  test('the heartbeat is a fraction of the lease by default', () => {
    expect(DEFAULT_ENGINE_OPTIONS.heartbeatSeconds).toBeLessThan(DEFAULT_ENGINE_OPTIONS.leaseSeconds / 2);
  });

  test('overrides replace only the options they name', () => {
    const options = resolveEngineOptions({ leaseSeconds: 30, heartbeatSeconds: 10, staleHeartbeatSeconds: 20, maxAttempts: 2 });
    expect(options).toEqual({ ...DEFAULT_ENGINE_OPTIONS, leaseSeconds: 30, heartbeatSeconds: 10, staleHeartbeatSeconds: 20, maxAttempts: 2 });
  });

  test('does not mutate the defaults object', () => {
    const before = { ...DEFAULT_ENGINE_OPTIONS };
    resolveEngineOptions({ leaseSeconds: 999, sweepBatchSize: 1 });
    expect(DEFAULT_ENGINE_OPTIONS).toEqual(before);
  });

  test.each([0, 61])('a sweep interval of %p s is rejected: more than 0, at most the scheduler\'s minute', (sweepIntervalSeconds) => {
    expect(() => resolveEngineOptions({ sweepIntervalSeconds })).toThrow(/sweepIntervalSeconds must be more than 0 and at most 60/);
  });

  test('zero is a valid value where it makes sense', () => {
    expect(resolveEngineOptions({ writeRetries: 0, progressFlushMs: 0 }).writeRetries).toBe(0);
  });

  test.each([
    [{ heartbeatSeconds: 180 }],
    [{ heartbeatSeconds: 200 }],
    [{ leaseSeconds: 5 }],
    [{ leaseSeconds: 10, heartbeatSeconds: 10 }],
  ] as Partial<EngineOptions>[][])('a heartbeat not shorter than the lease is rejected: %j', (overrides) => {
    expect(() => resolveEngineOptions(overrides)).toThrow(/heartbeatSeconds .* must be shorter than leaseSeconds/);
  });

  test("a lease that leaves the holder's stop age under two heartbeats is rejected: one late renewal would stop a live holder", () => {
    expect(() => resolveEngineOptions({ leaseSeconds: 61, heartbeatSeconds: 60, staleHeartbeatSeconds: 120, progressTimeoutSeconds: 200, clockSkewSeconds: 0 })).toThrow(
      /the holder's stop age \(the shorter of staleHeartbeatSeconds 120 s and leaseSeconds 61 s less clockSkewSeconds 0 s\) must be at least two heartbeats \(120 s\)/,
    );
    expect(resolveEngineOptions({ leaseSeconds: 122, heartbeatSeconds: 60, staleHeartbeatSeconds: 120, progressTimeoutSeconds: 200 }).leaseSeconds).toBe(122);
  });

  test('a skew allowance is taken off the lease, not the stale age: rejected only where the lease less it is under two heartbeats', () => {
    expect(() => resolveEngineOptions({ clockSkewSeconds: 11 })).toThrow(/leaseSeconds 20 s less clockSkewSeconds 11 s\) must be at least two heartbeats \(10 s\)/);
    expect(resolveEngineOptions({ clockSkewSeconds: 10 }).clockSkewSeconds).toBe(10);
    expect(resolveEngineOptions({ clockSkewSeconds: 4.5 }).clockSkewSeconds).toBe(4.5);
  });

  test('a stale-heartbeat threshold under two heartbeats is rejected: one late heartbeat is not a dead worker', () => {
    expect(() => resolveEngineOptions({ leaseSeconds: 90, heartbeatSeconds: 20, staleHeartbeatSeconds: 30 })).toThrow(/staleHeartbeatSeconds \(30\) must be at least two heartbeats/);
  });

  test('bug 4: a delay setting past what Cloud Tasks can schedule (30 days) is rejected', () => {
    expect(() => resolveEngineOptions({ maxServerDelaySeconds: 1e15 })).toThrow(/maxServerDelaySeconds must be at most 2592000 s/);
    expect(() => resolveEngineOptions({ backoffMaxSeconds: 40 * 86_400 })).toThrow(/backoffMaxSeconds must be at most/);
  });

  test('a progress bound not longer than the heartbeat is rejected', () => {
    expect(() => resolveEngineOptions({ progressTimeoutSeconds: 5 })).toThrow(/progressTimeoutSeconds \(5\) must be longer than heartbeatSeconds/);
  });

  test.each(Object.keys(DEFAULT_ENGINE_OPTIONS).filter((name) => name !== 'leaseSeconds') as (keyof EngineOptions)[])(
    'a negative %s is rejected with its name',
    (name) => {
      expect(() => resolveEngineOptions({ [name]: -1 })).toThrow(new RegExp(`Engine option ${name} must be a non-negative number, got -1`));
    },
  );

  test('a negative lease is rejected', () => {
    expect(() => resolveEngineOptions({ leaseSeconds: -1, heartbeatSeconds: -5 })).toThrow(/leaseSeconds/);
    expect(() => resolveEngineOptions({ leaseSeconds: -1 })).toThrow();
  });

  test.each(Object.keys(DEFAULT_ENGINE_OPTIONS) as (keyof EngineOptions)[])('NaN or infinite %s is rejected', (name) => {
    expect(() => resolveEngineOptions({ [name]: Number.NaN })).toThrow(new RegExp(`${name} must be a non-negative number, got NaN`));
    const infinite: Partial<EngineOptions> = name === 'leaseSeconds' ? { leaseSeconds: Number.POSITIVE_INFINITY } : { [name]: Number.POSITIVE_INFINITY, leaseSeconds: Number.MAX_SAFE_INTEGER };
    if (name === 'heartbeatSeconds') {
      expect(() => resolveEngineOptions(infinite)).toThrow(/heartbeatSeconds/);
    } else {
      expect(() => resolveEngineOptions(infinite)).toThrow(new RegExp(`${name} must be a non-negative number, got Infinity`));
    }
  });
});

describe('engineOptionsFromEnv', () => {
  test('with no PHASELINE_* variables, the defaults', () => {
    expect(engineOptionsFromEnv({ PATH: '/usr/bin', HOME: '/root' })).toEqual(DEFAULT_ENGINE_OPTIONS);
  });

  test('reads each PHASELINE_* variable into its option', () => {
    const options = engineOptionsFromEnv({
      PHASELINE_LEASE_SECONDS: '90',
      PHASELINE_HEARTBEAT_SECONDS: '20',
      PHASELINE_PROGRESS_FLUSH_MS: '250',
      PHASELINE_STEP_BUDGET_SECONDS: '120',
      PHASELINE_MAX_ATTEMPTS: '7',
      PHASELINE_MAX_STALE_RECLAIMS: '2',
      PHASELINE_BACKOFF_BASE_SECONDS: '3',
      PHASELINE_BACKOFF_MAX_SECONDS: '300',
      PHASELINE_LOST_TASK_GRACE_SECONDS: '45',
      PHASELINE_SWEEP_BATCH_SIZE: '50',
      PHASELINE_WRITE_RETRIES: '1',
      PHASELINE_MAX_SERVER_DELAY_SECONDS: '120',
      PHASELINE_STALE_HEARTBEAT_SECONDS: '45',
      PHASELINE_CLOCK_SKEW_SECONDS: '3',
      PHASELINE_PROGRESS_TIMEOUT_SECONDS: '200',
      PHASELINE_RETENTION_DAYS: '14',
    });
    expect(options).toEqual({
      leaseSeconds: 90,
      heartbeatSeconds: 20,
      progressFlushMs: 250,
      stepBudgetSeconds: 120,
      maxAttempts: 7,
      maxStaleReclaims: 2,
      backoffBaseSeconds: 3,
      backoffMaxSeconds: 300,
      lostTaskGraceSeconds: 45,
      sweepIntervalSeconds: DEFAULT_ENGINE_OPTIONS.sweepIntervalSeconds,
      sweepBatchSize: 50,
      writeRetries: 1,
      maxServerDelaySeconds: 120,
      staleHeartbeatSeconds: 45,
      clockSkewSeconds: 3,
      progressTimeoutSeconds: 200,
      retentionDays: 14,
    });
  });

  test('a retention of zero days is refused by name', () => {
    expect(() => engineOptionsFromEnv({ PHASELINE_RETENTION_DAYS: '0' })).toThrow(/retentionDays must be positive/);
  });

  test('empty variables are ignored, not read as zero', () => {
    const options = engineOptionsFromEnv({ PHASELINE_MAX_ATTEMPTS: '', PHASELINE_LEASE_SECONDS: '', PHASELINE_SWEEP_BATCH_SIZE: '25' });
    expect(options).toEqual({ ...DEFAULT_ENGINE_OPTIONS, sweepBatchSize: 25 });
  });

  test('a variable that is not a number is rejected with a message naming it', () => {
    expect(() => engineOptionsFromEnv({ PHASELINE_MAX_ATTEMPTS: 'five' })).toThrow('PHASELINE_MAX_ATTEMPTS must be a number, got "five"');
    expect(() => engineOptionsFromEnv({ PHASELINE_PROGRESS_FLUSH_MS: '1000ms' })).toThrow(/PHASELINE_PROGRESS_FLUSH_MS/);
    expect(() => engineOptionsFromEnv({ PHASELINE_LEASE_SECONDS: 'Infinity' })).toThrow(/PHASELINE_LEASE_SECONDS must be a number/);
  });

  test('values from the environment are validated like overrides', () => {
    expect(() => engineOptionsFromEnv({ PHASELINE_HEARTBEAT_SECONDS: '180' })).toThrow(/must be shorter than leaseSeconds/);
    expect(() => engineOptionsFromEnv({ PHASELINE_WRITE_RETRIES: '-2' })).toThrow(/writeRetries must be a non-negative number/);
  });

  test('reads process.env when no environment is passed', () => {
    const saved = process.env.PHASELINE_SWEEP_BATCH_SIZE;
    process.env.PHASELINE_SWEEP_BATCH_SIZE = '17';
    try {
      expect(engineOptionsFromEnv().sweepBatchSize).toBe(17);
    } finally {
      if (saved === undefined) delete process.env.PHASELINE_SWEEP_BATCH_SIZE;
      else process.env.PHASELINE_SWEEP_BATCH_SIZE = saved;
    }
  });
});

describe('clock', () => {
  test('ManualClock starts where it is told and moves only by hand', () => {
    const clock = new ManualClock(1_000);
    expect(clock.now()).toBe(1_000);
    expect(clock.now()).toBe(1_000);
    clock.advance(250);
    expect(clock.now()).toBe(1_250);
    clock.advance(0);
    expect(clock.now()).toBe(1_250);
    clock.set(50);
    expect(clock.now()).toBe(50);
    clock.advance(10);
    expect(clock.now()).toBe(60);
  });

  test('ManualClock defaults to a fixed instant, not the wall clock', () => {
    expect(new ManualClock().now()).toBe(Date.UTC(2026, 0, 1));
  });

  test('systemClock reads the wall clock', () => {
    const before = Date.now();
    const now = systemClock.now();
    expect(now).toBeGreaterThanOrEqual(before);
    expect(now).toBeLessThanOrEqual(Date.now());
  });

  function draws(seed: number, count: number): number[] {
    const random = seededRandom(seed);
    return Array.from({ length: count }, () => random());
  }

  test('seededRandom is deterministic for a seed', () => {
    expect(draws(1234, 50)).toEqual(draws(1234, 50));
  });

  test('seededRandom differs across seeds', () => {
    expect(draws(1, 20)).not.toEqual(draws(2, 20));
    expect(draws(0, 20)).not.toEqual(draws(1, 20));
  });

  test('seededRandom does not repeat one value', () => {
    expect(new Set(draws(99, 1_000)).size).toBeGreaterThan(990);
  });

  test('seededRandom stays in [0, 1) and covers the range', () => {
    for (const seed of [0, 1, 42, 0xffffffff, -7]) {
      const values = draws(seed, 2_000);
      expect(values.filter((value) => !(value >= 0 && value < 1))).toEqual([]);
      expect(Math.min(...values)).toBeLessThan(0.01);
      expect(Math.max(...values)).toBeGreaterThan(0.99);
      const mean = values.reduce((sum, value) => sum + value, 0) / values.length;
      expect(mean).toBeGreaterThan(0.45);
      expect(mean).toBeLessThan(0.55);
    }
  });
});

describe('task IDs', () => {
  const TASK_ID = /^[A-Za-z0-9_-]+$/;

  test('stepTaskId is deterministic and names the job, step and dispatch', () => {
    expect(stepTaskId('job-abc', 3, 1)).toBe('job-abc-s3-d1');
    expect(stepTaskId('job-abc', 3, 1)).toBe(stepTaskId('job-abc', 3, 1));
    expect(stepTaskId('job-abc', 3, 1)).toMatch(TASK_ID);
  });

  test('stepTaskId changes with the step and with the dispatch', () => {
    const ids = new Set([stepTaskId('j', 0, 0), stepTaskId('j', 1, 0), stepTaskId('j', 0, 1), stepTaskId('k', 0, 0)]);
    expect(ids.size).toBe(4);
  });

  test('unitTaskId is deterministic and names job, fan-out epoch, unit, step and dispatch', () => {
    expect(unitTaskId('job-abc', 4, 'expert-1', 2, 0)).toBe('job-abc-e4-uexpert-1-s2-d0');
    expect(unitTaskId('job-abc', 4, 'expert-1', 2, 0)).toBe(unitTaskId('job-abc', 4, 'expert-1', 2, 0));
    const ids = new Set([unitTaskId('j', 1, 'a', 0, 0), unitTaskId('j', 2, 'a', 0, 0), unitTaskId('j', 1, 'b', 0, 0), unitTaskId('j', 1, 'a', 0, 1), unitTaskId('j', 1, 'a', 1, 0)]);
    expect(ids.size).toBe(5);
  });

  test.each(['Dr. Ada Lovelace', 'a/b', 'c++', 'naïve', 'x:y?z#1', 'tab\tnew\nline', '日本', 'émile@example.com'])(
    'a unit named %j is sanitised to a valid task ID',
    (unit) => {
      const id = unitTaskId('job-1', 2, unit, 1, 3);
      expect(id).toMatch(TASK_ID);
      expect(id.startsWith('job-1-e2-u')).toBe(true);
      expect(id.endsWith('-d3')).toBe(true);
      expect(unitTaskId('job-1', 2, unit, 1, 3)).toBe(id);
    },
  );

  test('sanitising replaces each odd character with an underscore', () => {
    expect(unitTaskId('j', 0, 'Dr. Ada', 0, 0)).toBe('j-e0-uDr__Ada-s0-d0');
    expect(unitTaskId('j', 0, 'a/b', 0, 0)).toBe('j-e0-ua_b-s0-d0');
  });
});
