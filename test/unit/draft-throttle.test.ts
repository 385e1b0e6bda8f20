/** Drafts of sections in flight: at most one write per interval per section, always the latest text. */
import { ManualClock } from '../../functions/src/core/clock';
import { DraftThrottle } from '../../functions/src/core/draft-throttle';
import { ManualTimers } from '../support/timers';

function setUp(write: (sectionId: string, text: string) => Promise<void> = () => Promise.resolve()) {
  const clock = new ManualClock(Date.UTC(2026, 10, 30));
  const timers = new ManualTimers();
  const written: [string, string][] = [];
  const errors: unknown[] = [];
  const throttle = new DraftThrottle(
    async (sectionId, text) => {
      written.push([sectionId, text]);
      await write(sectionId, text);
    },
    { minIntervalMs: 1_000, clock, timers, onWriteError: (error) => errors.push(error) },
  );
  return { clock, timers, written, errors, throttle };
}

const settle = () => new Promise<void>((resolve) => setImmediate(resolve));

describe('draft throttle', () => {
  it('writes the first text at once, then at most once a second with the latest text', async () => {
    const { clock, timers, written, throttle } = setUp();
    throttle.show('s1', 'A');
    await settle();
    throttle.show('s1', 'AB');
    throttle.show('s1', 'ABC');
    await settle();
    expect(written).toEqual([['s1', 'A']]);
    expect(timers.pendingDelays).toEqual([1_000]);

    clock.advance(1_000);
    timers.fireAll();
    await settle();
    expect(written).toEqual([
      ['s1', 'A'],
      ['s1', 'ABC'],
    ]);
    // Nothing new: no timer left behind.
    expect(timers.size).toBe(0);
  });

  it('paces each section on its own', async () => {
    const { written, throttle } = setUp();
    throttle.show('s1', 'one');
    throttle.show('s2', 'two');
    await settle();
    expect(written).toEqual([
      ['s1', 'one'],
      ['s2', 'two'],
    ]);
  });

  it('never overlaps two writes of one section: text shown during a slow write waits for it', async () => {
    let release: () => void = () => undefined;
    const { clock, timers, written, throttle } = setUp(() => new Promise<void>((resolve) => (release = resolve)));
    throttle.show('s1', 'A');
    clock.advance(5_000);
    throttle.show('s1', 'AB');
    await settle();
    expect(written).toEqual([['s1', 'A']]);
    expect(timers.size).toBe(0);
    release();
    await settle();
    // The interval since the first write has passed: the latest text goes out as soon as the first write returns.
    expect(written).toEqual([
      ['s1', 'A'],
      ['s1', 'AB'],
    ]);
  });

  it('a failed write is reported and forgotten; the next text is written', async () => {
    let fail = true;
    const { clock, written, errors, throttle } = setUp(() => (fail ? Promise.reject(new Error('unavailable')) : Promise.resolve()));
    throttle.show('s1', 'A');
    await settle();
    expect(errors).toHaveLength(1);
    fail = false;
    clock.advance(1_000);
    throttle.show('s1', 'AB');
    await settle();
    expect(written.map(([, text]) => text)).toEqual(['A', 'AB']);
  });

  it('after stop nothing is written and no timer is left', async () => {
    const { timers, written, throttle } = setUp();
    throttle.show('s1', 'A');
    await settle();
    throttle.show('s1', 'AB');
    expect(timers.size).toBe(1);
    throttle.stop();
    expect(timers.size).toBe(0);
    throttle.show('s1', 'ABC');
    timers.fireAll();
    await settle();
    expect(written).toEqual([['s1', 'A']]);
  });
});
