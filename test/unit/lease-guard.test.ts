/** The holder's lease guard and the signal that checks it on every read (core/lease-guard.ts). */
import { ManualClock } from '../../functions/src/core/clock';
import { OwnershipLostError } from '../../functions/src/core/errors';
import { abortedAlready, abortOnLapse, LeaseGuard, LeaseLapsedError } from '../../functions/src/core/lease-guard';
import { DEFAULT_ENGINE_OPTIONS, holderStopAgeMs, resolveEngineOptions, takeoverAgeMs } from '../../functions/src/core/options';

describe('LeaseGuard', () => {
  test('lapses at exactly its stop age after the last confirmed renewal, not a millisecond before', () => {
    const clock = new ManualClock(1_000_000);
    const guard = new LeaseGuard(clock, 10_000, clock.now());
    clock.advance(9_999);
    expect(guard.lapse()).toBeNull();
    clock.advance(1);
    const lapse = guard.lapse();
    expect(lapse).toBeInstanceOf(LeaseLapsedError);
    expect(lapse).toBeInstanceOf(OwnershipLostError);
    expect(lapse?.message).toMatch(/no renewal confirmed for 10 s/);
  });

  test('a confirmed renewal moves the limit; a late answer of an older renewal never moves it back', () => {
    const clock = new ManualClock(0);
    const guard = new LeaseGuard(clock, 10_000, 0);
    guard.confirm(8_000);
    guard.confirm(3_000);
    expect(guard.deadlineMs).toBe(18_000);
    clock.set(17_999);
    expect(guard.lapse()).toBeNull();
  });

  test('a renewal confirmed late counts from when it was stamped, not from when its answer came', () => {
    const clock = new ManualClock(0);
    const guard = new LeaseGuard(clock, 10_000, 0);
    clock.set(30_000);
    // Sent at 5 s, answered at 30 s (the worker was frozen in between).
    guard.confirm(5_000);
    expect(guard.lapse()).toBeInstanceOf(LeaseLapsedError);
  });

  test.each([0, -1, Number.NaN, Number.POSITIVE_INFINITY])('a stop age of %p is refused', (age) => {
    expect(() => new LeaseGuard(new ManualClock(0), age, 0)).toThrow(/stopAfterMs must be a positive number/);
  });
});

describe('holderStopAgeMs', () => {
  test('the holder stops at the stale age and a redelivered task takes over the skew allowance later: 10 s and 12 s on the defaults, 5 s past a renewal due every 5 s', () => {
    expect(holderStopAgeMs(DEFAULT_ENGINE_OPTIONS)).toBe(10_000);
    expect(takeoverAgeMs(DEFAULT_ENGINE_OPTIONS)).toBe(12_000);
    expect(holderStopAgeMs(DEFAULT_ENGINE_OPTIONS) - DEFAULT_ENGINE_OPTIONS.heartbeatSeconds * 1000).toBe(5_000);
    // A larger allowance costs the taker time, never the holder slack.
    expect(holderStopAgeMs({ ...DEFAULT_ENGINE_OPTIONS, clockSkewSeconds: 5 })).toBe(10_000);
    expect(takeoverAgeMs({ ...DEFAULT_ENGINE_OPTIONS, clockSkewSeconds: 5 })).toBe(15_000);
  });

  test('a lease shorter than the takeover age is the sooner takeover: the allowance comes off it', () => {
    expect(holderStopAgeMs({ staleHeartbeatSeconds: 30, leaseSeconds: 20, clockSkewSeconds: 4 })).toBe(16_000);
  });

  test("whatever the taker's clock is ahead by, up to the allowance, the holder has stopped (by its own clock) when the taker's reads the takeover age", () => {
    const options = resolveEngineOptions();
    const takeoverMs = takeoverAgeMs(options);
    for (const aheadMs of [0, 500, 1_999, options.clockSkewSeconds * 1000]) {
      const taker = new ManualClock(1_000_000 + aheadMs);
      const holder = new ManualClock(1_000_000);
      // The holder stamps its renewal on its own clock; the taker compares that stamp with its clock.
      const guard = new LeaseGuard(holder, holderStopAgeMs(options), holder.now());
      const stamp = holder.now();
      const untilTakeoverMs = stamp + takeoverMs - taker.now();
      holder.advance(untilTakeoverMs);
      taker.advance(untilTakeoverMs);
      expect(taker.now() - stamp).toBe(takeoverMs);
      expect(guard.lapse()).toBeInstanceOf(LeaseLapsedError);
    }
  });
});

describe('abortOnLapse', () => {
  test('a read of aborted or throwIfAborted aborts the controller with the lapse, once, and listeners hear it', () => {
    const controller = new AbortController();
    let lapse: Error | null = null;
    let checks = 0;
    const signal = abortOnLapse(controller, () => {
      checks += 1;
      return lapse;
    });
    const heard: unknown[] = [];
    signal.addEventListener('abort', () => heard.push(signal.reason));
    expect(signal.aborted).toBe(false);
    expect(() => signal.throwIfAborted()).not.toThrow();
    lapse = new LeaseLapsedError('lapsed');
    expect(() => signal.throwIfAborted()).toThrow(lapse);
    expect(signal.aborted).toBe(true);
    expect(heard).toEqual([lapse]);
    // Once aborted, the check is not asked again.
    const asked = checks;
    expect(signal.aborted).toBe(true);
    expect(checks).toBe(asked);
  });

  test('an abort for another reason stays that reason, and abortedAlready reads it without a check', () => {
    const controller = new AbortController();
    const signal = abortOnLapse(controller, () => {
      throw new Error('checked');
    });
    expect(abortedAlready(signal)).toBe(false);
    const cancelled = new Error('cancelled');
    controller.abort(cancelled);
    expect(signal.aborted).toBe(true);
    expect(signal.reason).toBe(cancelled);
  });
});
