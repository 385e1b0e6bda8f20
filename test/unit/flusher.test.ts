/**
 * The coalescing flusher: progress, cost and notes merged into at most one job write per
 * interval, a heartbeat write when nothing else happens, and no lost or double-counted payload
 * when a write fails. Time is a ManualClock and timers fire only when the test says so.
 */
import { ManualClock } from '../../functions/src/core/clock';
import { OwnershipLostError } from '../../functions/src/core/errors';
import { addCounts, applyClaimTally, CoalescingFlusher, type ClaimTally, type FlushPayload, type FlusherOptions, type Timers } from '../../functions/src/core/flusher';
import { ManualTimers } from '../support/timers';

/** Lets every pending promise callback run (a macrotask turn, not a sleep). */
async function settle(): Promise<void> {
  for (let turn = 0; turn < 3; turn += 1) {
    await new Promise<void>((resolve) => {
      setImmediate(resolve);
    });
  }
}

/** Timers that know when they are due on a ManualClock; `runDue` fires the due ones, earliest first. */
class DueTimers implements Timers {
  private nextHandle = 1;
  private readonly pending = new Map<number, { callback: () => void; dueAtMs: number }>();

  constructor(private readonly clock: ManualClock) {}

  setTimeout(callback: () => void, ms: number): unknown {
    const handle = this.nextHandle++;
    this.pending.set(handle, { callback, dueAtMs: this.clock.now() + ms });
    return handle;
  }

  clearTimeout(handle: unknown): void {
    this.pending.delete(handle as number);
  }

  get size(): number {
    return this.pending.size;
  }

  runDue(): number {
    let fired = 0;
    for (;;) {
      let next: [number, { callback: () => void; dueAtMs: number }] | undefined;
      for (const entry of this.pending) {
        if (entry[1].dueAtMs <= this.clock.now() && (next === undefined || entry[1].dueAtMs < next[1].dueAtMs)) next = entry;
      }
      if (next === undefined) return fired;
      this.pending.delete(next[0]);
      next[1].callback();
      fired += 1;
    }
  }
}

interface RecordedWrite {
  readonly payload: FlushPayload;
  readonly atMs: number;
}

/** A write that succeeds at once and records what it was given. */
function recordingWrite(clock: ManualClock): { write: (payload: FlushPayload) => Promise<void>; calls: RecordedWrite[] } {
  const calls: RecordedWrite[] = [];
  return {
    calls,
    write: (payload) => {
      calls.push({ payload: structuredClone(payload), atMs: clock.now() });
      return Promise.resolve();
    },
  };
}

interface PendingWrite {
  readonly payload: FlushPayload;
  readonly atMs: number;
  settled: boolean;
  resolve(): void;
  reject(error: unknown): void;
}

/** A write that stays in flight until the test settles it; tracks how many are in flight at once. */
function controlledWrite(clock: ManualClock): {
  write: (payload: FlushPayload) => Promise<void>;
  calls: PendingWrite[];
  pending: () => PendingWrite[];
  maxInFlight: () => number;
} {
  const calls: PendingWrite[] = [];
  let inFlight = 0;
  let maxInFlight = 0;
  return {
    calls,
    pending: () => calls.filter((call) => !call.settled),
    maxInFlight: () => maxInFlight,
    write: (payload) =>
      new Promise<void>((resolve, reject) => {
        inFlight += 1;
        maxInFlight = Math.max(maxInFlight, inFlight);
        const call: PendingWrite = {
          payload: structuredClone(payload),
          atMs: clock.now(),
          settled: false,
          resolve: () => {
            call.settled = true;
            inFlight -= 1;
            resolve();
          },
          reject: (error) => {
            call.settled = true;
            inFlight -= 1;
            reject(error instanceof Error ? error : new Error(String(error)));
          },
        };
        calls.push(call);
      }),
  };
}

const EMPTY: FlushPayload = { progress: {}, cost: {}, notes: [], notesFrom: 0 };

function options(clock: ManualClock, timers: Timers, extra: Partial<FlusherOptions> = {}): FlusherOptions {
  return { minIntervalMs: 1_000, heartbeatMs: 60_000, clock, timers, onOwnershipLost: jest.fn(), ...extra };
}

describe('CoalescingFlusher: coalescing', () => {
  test('many calls within one interval produce one write with merged progress, summed cost and all notes in order', async () => {
    const clock = new ManualClock();
    const timers = new ManualTimers();
    const { write, calls } = recordingWrite(clock);
    const flusher = new CoalescingFlusher(write, options(clock, timers));

    flusher.reportProgress({ sectionsDone: 1, sectionsTotal: 10 });
    flusher.addCost({ usd: 0.5, calls: 1 });
    flusher.note('section', 'first section done');
    clock.advance(10);
    flusher.reportProgress({ sectionsDone: 2 });
    flusher.addCost({ usd: 0.25, calls: 1, tokens: 900 });
    flusher.note('section', 'second section done');
    clock.advance(10);
    flusher.reportProgress({ sectionsDone: 5 });
    flusher.note('tool', 'search called');

    expect(timers.size).toBe(1);
    expect(calls).toHaveLength(0);

    timers.fireAll();
    await settle();

    expect(calls).toHaveLength(1);
    expect(calls[0]!.payload).toEqual({
      progress: { sectionsDone: 5, sectionsTotal: 10 },
      cost: { usd: 0.75, calls: 2, tokens: 900 },
      notes: [
        { kind: 'section', message: 'first section done' },
        { kind: 'section', message: 'second section done' },
        { kind: 'tool', message: 'search called' },
      ],
      notesFrom: 0,
    });
    expect(flusher.writes).toBe(1);
    expect(timers.size).toBe(0);
  });

  test('progress and notes once written are not written again; cost is the running total of the claim', async () => {
    const clock = new ManualClock();
    const timers = new ManualTimers();
    const { write, calls } = recordingWrite(clock);
    const flusher = new CoalescingFlusher(write, options(clock, timers));

    flusher.reportProgress({ done: 1 });
    flusher.addCost({ usd: 1 });
    flusher.note('a', 'one');
    timers.fireAll();
    await settle();
    clock.advance(1_000);
    flusher.addCost({ usd: 2 });
    timers.fireAll();
    await settle();

    expect(calls.map((call) => call.payload)).toEqual([
      { progress: { done: 1 }, cost: { usd: 1 }, notes: [{ kind: 'a', message: 'one' }], notesFrom: 0 },
      { progress: {}, cost: { usd: 3 }, notes: [], notesFrom: 1 },
    ]);
  });

  test('the first write goes at once; a second batch waits until minIntervalMs after it', async () => {
    const clock = new ManualClock(0);
    const timers = new DueTimers(clock);
    const { write, calls } = recordingWrite(clock);
    const flusher = new CoalescingFlusher(write, options(clock, timers, { minIntervalMs: 1_000 }));

    flusher.reportProgress({ done: 1 });
    timers.runDue();
    await settle();
    expect(calls.map((call) => call.atMs)).toEqual([0]);

    clock.advance(10);
    flusher.reportProgress({ done: 2 });
    flusher.addCost({ calls: 1 });
    expect(timers.runDue()).toBe(0);
    clock.advance(979);
    flusher.reportProgress({ done: 3 });
    expect(timers.runDue()).toBe(0);
    await settle();
    expect(calls).toHaveLength(1);

    clock.advance(11);
    expect(timers.runDue()).toBe(1);
    await settle();
    expect(calls).toHaveLength(2);
    expect(calls[1]).toEqual({ atMs: 1_000, payload: { progress: { done: 3 }, cost: { calls: 1 }, notes: [], notesFrom: 0 } });
  });

  test('a report long after the last write is written without waiting', async () => {
    const clock = new ManualClock(0);
    const timers = new DueTimers(clock);
    const { write, calls } = recordingWrite(clock);
    const flusher = new CoalescingFlusher(write, options(clock, timers, { minIntervalMs: 1_000 }));

    flusher.note('a', 'first');
    timers.runDue();
    await settle();
    clock.advance(5_000);
    flusher.note('b', 'second');
    expect(timers.runDue()).toBe(1);
    await settle();
    expect(calls.map((call) => call.atMs)).toEqual([0, 5_000]);
  });
});

describe('CoalescingFlusher: heartbeat', () => {
  test('the heartbeat writes even with nothing pending, and re-arms', async () => {
    const clock = new ManualClock();
    const timers = new ManualTimers();
    const { write, calls } = recordingWrite(clock);
    const flusher = new CoalescingFlusher(write, options(clock, timers));

    expect(timers.size).toBe(0);
    flusher.start();
    expect(timers.size).toBe(1);

    timers.fireAll();
    await settle();
    expect(calls.map((call) => call.payload)).toEqual([EMPTY]);
    expect(timers.size).toBe(1);

    timers.fireAll();
    await settle();
    expect(calls.map((call) => call.payload)).toEqual([EMPTY, EMPTY]);
    expect(flusher.writes).toBe(2);
    expect(timers.size).toBe(1);
  });

  test('the heartbeat fires every heartbeatMs, not sooner', async () => {
    const clock = new ManualClock(0);
    const timers = new DueTimers(clock);
    const { write, calls } = recordingWrite(clock);
    const flusher = new CoalescingFlusher(write, options(clock, timers, { heartbeatMs: 60_000 }));
    flusher.start();

    clock.advance(59_999);
    expect(timers.runDue()).toBe(0);
    clock.advance(1);
    expect(timers.runDue()).toBe(1);
    await settle();
    clock.advance(59_999);
    expect(timers.runDue()).toBe(0);
    clock.advance(1);
    expect(timers.runDue()).toBe(1);
    await settle();
    expect(calls.map((call) => call.atMs)).toEqual([60_000, 120_000]);
  });

  test('a heartbeat carries whatever is pending', async () => {
    const clock = new ManualClock();
    const timers = new ManualTimers();
    const { write, calls } = recordingWrite(clock);
    const flusher = new CoalescingFlusher(write, options(clock, timers));
    flusher.start();
    flusher.reportProgress({ done: 4 });

    timers.fireAll();
    await settle();
    expect(calls.map((call) => call.payload)).toContainEqual({ progress: { done: 4 }, cost: {}, notes: [], notesFrom: 0 });
    expect(calls.filter((call) => call.payload.progress.done === 4)).toHaveLength(1);
  });
});

describe('CoalescingFlusher: failed writes', () => {
  test('lost ownership calls onOwnershipLost once and stops every further write', async () => {
    const clock = new ManualClock();
    const timers = new ManualTimers();
    const lost = new OwnershipLostError('epoch 3 superseded by epoch 4');
    const write = jest.fn((_payload: FlushPayload) => Promise.reject(lost));
    const onOwnershipLost = jest.fn();
    const onWriteError = jest.fn();
    const flusher = new CoalescingFlusher(write, options(clock, timers, { onOwnershipLost, onWriteError }));
    flusher.start();
    flusher.reportProgress({ done: 1 });

    timers.fireAll();
    await settle();

    expect(write).toHaveBeenCalledTimes(1);
    expect(onOwnershipLost).toHaveBeenCalledTimes(1);
    expect(onOwnershipLost).toHaveBeenCalledWith(lost);
    expect(onWriteError).not.toHaveBeenCalled();
    expect(flusher.writes).toBe(0);
    expect(timers.size).toBe(0);

    clock.advance(10_000);
    flusher.reportProgress({ done: 2 });
    flusher.addCost({ usd: 1 });
    flusher.note('late', 'after the loss');
    expect(timers.size).toBe(0);
    await flusher.flushNow();
    timers.fireAll();
    await settle();
    expect(write).toHaveBeenCalledTimes(1);
    expect(onOwnershipLost).toHaveBeenCalledTimes(1);
  });

  test('another error calls onWriteError, and the next write carries the unconfirmed notes and the running cost again', async () => {
    const clock = new ManualClock();
    const timers = new ManualTimers();
    const outage = new Error('UNAVAILABLE: try again');
    const calls: FlushPayload[] = [];
    let failNext = true;
    const write = (payload: FlushPayload): Promise<void> => {
      calls.push(structuredClone(payload));
      if (failNext) {
        failNext = false;
        return Promise.reject(outage);
      }
      return Promise.resolve();
    };
    const onOwnershipLost = jest.fn();
    const onWriteError = jest.fn();
    const flusher = new CoalescingFlusher(write, options(clock, timers, { onOwnershipLost, onWriteError }));

    flusher.reportProgress({ done: 1, total: 3 });
    flusher.addCost({ usd: 1, calls: 1 });
    flusher.note('section', 'first');
    timers.fireAll();
    await settle();

    expect(onWriteError).toHaveBeenCalledTimes(1);
    expect(onWriteError).toHaveBeenCalledWith(outage);
    expect(flusher.writes).toBe(0);

    clock.advance(1_000);
    flusher.reportProgress({ done: 2 });
    flusher.addCost({ usd: 2 });
    flusher.note('section', 'second');
    timers.fireAll();
    await settle();

    expect(calls).toHaveLength(2);
    expect(calls[1]).toEqual({
      progress: { done: 2, total: 3 },
      cost: { usd: 3, calls: 1 },
      notes: [
        { kind: 'section', message: 'first' },
        { kind: 'section', message: 'second' },
      ],
      notesFrom: 0,
    });
    expect(flusher.writes).toBe(1);
    expect(onOwnershipLost).not.toHaveBeenCalled();
  });

  test('a failed payload is carried by the next heartbeat when nothing new is reported', async () => {
    const clock = new ManualClock();
    const timers = new ManualTimers();
    const calls: FlushPayload[] = [];
    let failures = 1;
    const write = (payload: FlushPayload): Promise<void> => {
      calls.push(structuredClone(payload));
      if (failures > 0) {
        failures -= 1;
        return Promise.reject(new Error('DEADLINE_EXCEEDED'));
      }
      return Promise.resolve();
    };
    const flusher = new CoalescingFlusher(write, options(clock, timers, { onWriteError: jest.fn() }));
    flusher.start();
    flusher.addCost({ calls: 4 });
    flusher.note('tool', 'fetch');

    // The heartbeat and the flush timer fire together: the first write fails, the second carries it.
    timers.fireAll();
    await settle();
    timers.fireAll();
    await settle();

    expect(calls[0]).toEqual({ progress: {}, cost: { calls: 4 }, notes: [{ kind: 'tool', message: 'fetch' }], notesFrom: 0 });
    expect(calls.length).toBeGreaterThan(1);
    // Every later write carries the running total, never more: applying it twice cannot count twice.
    expect(calls.slice(1).map((payload) => payload.cost.calls)).toEqual(calls.slice(1).map(() => 4));
    expect(calls.slice(1).flatMap((payload) => payload.notes)).toEqual([{ kind: 'tool', message: 'fetch' }]);
    expect(await flusher.stop()).toEqual({ progress: {}, cost: { calls: 4 }, notes: [], notesFrom: 1 });
  });
});

describe('CoalescingFlusher: stop', () => {
  test('stop clears the timers and returns the unwritten payload', async () => {
    const clock = new ManualClock();
    const timers = new ManualTimers();
    const write = jest.fn((_payload: FlushPayload) => Promise.resolve());
    const flusher = new CoalescingFlusher(write, options(clock, timers));
    flusher.start();
    flusher.reportProgress({ done: 7 });
    flusher.addCost({ usd: 0.1 });
    flusher.addCost({ usd: 0.2 });
    flusher.note('stop', 'stopping');
    expect(timers.size).toBe(2);

    const rest = await flusher.stop();

    expect(timers.size).toBe(0);
    expect(write).not.toHaveBeenCalled();
    expect(rest.progress).toEqual({ done: 7 });
    expect(rest.cost.usd).toBeCloseTo(0.3, 10);
    expect(rest.notes).toEqual([{ kind: 'stop', message: 'stopping' }]);

    flusher.reportProgress({ done: 8 });
    expect(timers.size).toBe(0);
    await flusher.flushNow();
    expect(write).not.toHaveBeenCalled();
  });

  test('stop waits for the write in flight and returns only what it did not carry', async () => {
    const clock = new ManualClock();
    const timers = new ManualTimers();
    const writes = controlledWrite(clock);
    const flusher = new CoalescingFlusher(writes.write, options(clock, timers));
    flusher.reportProgress({ done: 1 });
    timers.fireAll();
    await settle();
    expect(writes.pending()).toHaveLength(1);

    flusher.reportProgress({ done: 2 });
    flusher.addCost({ usd: 5 });
    let stopped = false;
    const stopping = flusher.stop().then((payload) => {
      stopped = true;
      return payload;
    });
    await settle();
    expect(stopped).toBe(false);
    expect(timers.size).toBe(0);

    writes.pending()[0]!.resolve();
    const rest = await stopping;
    expect(rest).toEqual({ progress: { done: 2 }, cost: { usd: 5 }, notes: [], notesFrom: 0 });
    expect(writes.calls).toHaveLength(1);
    expect(flusher.writes).toBe(1);
  });

  test('stop returns the payload of an in-flight write that failed, merged with the newer one', async () => {
    const clock = new ManualClock();
    const timers = new ManualTimers();
    const writes = controlledWrite(clock);
    const onWriteError = jest.fn();
    const flusher = new CoalescingFlusher(writes.write, options(clock, timers, { onWriteError }));
    flusher.reportProgress({ done: 1, total: 2 });
    flusher.addCost({ usd: 1 });
    flusher.note('a', 'carried');
    timers.fireAll();
    await settle();

    flusher.reportProgress({ done: 2 });
    flusher.addCost({ usd: 2 });
    flusher.note('b', 'newer');
    const stopping = flusher.stop();
    writes.pending()[0]!.reject(new Error('ABORTED'));

    expect(await stopping).toEqual({
      progress: { done: 2, total: 2 },
      cost: { usd: 3 },
      notes: [
        { kind: 'a', message: 'carried' },
        { kind: 'b', message: 'newer' },
      ],
      notesFrom: 0,
    });
    expect(onWriteError).toHaveBeenCalledTimes(1);
  });
});

describe('CoalescingFlusher: write rate', () => {
  async function simulate(minIntervalMs: number): Promise<{ calls: RecordedWrite[]; durationMs: number; rest: FlushPayload }> {
    const clock = new ManualClock(0);
    const timers = new DueTimers(clock);
    const { write, calls } = recordingWrite(clock);
    const flusher = new CoalescingFlusher(write, options(clock, timers, { minIntervalMs, heartbeatMs: 60_000 }));
    flusher.start();
    for (let section = 1; section <= 100; section += 1) {
      clock.advance(10);
      timers.runDue();
      await settle();
      flusher.reportProgress({ sectionsDone: section, sectionsTotal: 100 });
      flusher.addCost({ calls: 1 });
      flusher.note('section', `s${section}`);
    }
    const durationMs = clock.now();
    // Let the last coalesced write go out.
    for (let tick = 0; tick < minIntervalMs / 10; tick += 1) {
      clock.advance(10);
      timers.runDue();
      await settle();
    }
    const rest = await flusher.stop();
    return { calls, durationMs, rest };
  }

  test.each([100, 250, 1_000])('100 sections 10 ms apart with minIntervalMs %i: bounded writes, nothing lost', async (minIntervalMs) => {
    const { calls, durationMs, rest } = await simulate(minIntervalMs);

    expect(calls.length).toBeLessThanOrEqual(Math.floor(durationMs / minIntervalMs) + 2);
    expect(calls.length).toBeGreaterThanOrEqual(Math.floor(durationMs / minIntervalMs));
    for (let index = 1; index < calls.length; index += 1) {
      expect(calls[index]!.atMs - calls[index - 1]!.atMs).toBeGreaterThanOrEqual(minIntervalMs);
    }
    expect(rest).toEqual({ progress: {}, cost: { calls: 100 }, notes: [], notesFrom: 100 });
    expect(calls.at(-1)!.payload.progress).toEqual({ sectionsDone: 100, sectionsTotal: 100 });
    expect(calls.at(-1)!.payload.cost).toEqual({ calls: 100 });
    expect(calls.flatMap((call) => call.payload.notes.map((note) => note.message))).toEqual(Array.from({ length: 100 }, (_, index) => `s${index + 1}`));
  });
});

describe('CoalescingFlusher: slow writes', () => {
  /** A write in flight (slow under contention) while two flushes queue up behind it. */
  async function twoFlushesQueuedBehindASlowWrite(extra: Partial<FlusherOptions> = {}) {
    const clock = new ManualClock(0);
    const timers = new DueTimers(clock);
    const writes = controlledWrite(clock);
    const flusher = new CoalescingFlusher(writes.write, options(clock, timers, { minIntervalMs: 1_000, ...extra }));

    flusher.reportProgress({ done: 1 });
    timers.runDue();
    await settle();
    expect(writes.pending()).toHaveLength(1);

    clock.advance(500);
    flusher.reportProgress({ done: 2 });
    clock.advance(500);
    timers.runDue(); // the flush timer fires while the first write is still in flight
    await settle();
    clock.advance(200);
    flusher.reportProgress({ done: 3 });
    timers.runDue(); // due at once: the interval since the last write start has passed
    await settle();
    clock.advance(1_800);
    return { clock, timers, writes, flusher };
  }

  test('never has two writes to the job document in flight at once', async () => {
    const { writes } = await twoFlushesQueuedBehindASlowWrite();

    writes.pending()[0]!.resolve();
    await settle();
    for (let round = 0; round < 5 && writes.pending().length > 0; round += 1) {
      for (const call of writes.pending()) call.resolve();
      await settle();
    }

    expect(writes.maxInFlight()).toBe(1);
    // Nothing is lost either: the progress written, merged in order, ends at the last report.
    expect(Object.assign({}, ...writes.calls.map((call) => call.payload.progress))).toEqual({ done: 3 });
  });

  test('calls onOwnershipLost once even when flushes were queued behind the failing write', async () => {
    const onOwnershipLost = jest.fn();
    const { writes } = await twoFlushesQueuedBehindASlowWrite({ onOwnershipLost });

    writes.pending()[0]!.resolve();
    await settle();
    for (let round = 0; round < 5 && writes.pending().length > 0; round += 1) {
      for (const call of writes.pending()) call.reject(new OwnershipLostError('claimed by a newer epoch'));
      await settle();
    }

    expect(onOwnershipLost).toHaveBeenCalledTimes(1);
  });
});

describe('addCounts', () => {
  test('sums shared keys and keeps the others', () => {
    expect(addCounts({ usd: 1.5, calls: 2, kept: 9 }, { usd: 0.5, calls: 3, fresh: 4 })).toEqual({ usd: 2, calls: 5, kept: 9, fresh: 4 });
  });

  test('returns a new object and leaves both inputs alone', () => {
    const base = { calls: 1 };
    const increments = { calls: 2 };
    const sum = addCounts(base, increments);
    expect(sum).toEqual({ calls: 3 });
    expect(sum).not.toBe(base);
    expect(base).toEqual({ calls: 1 });
    expect(increments).toEqual({ calls: 2 });
  });

  test('empty increments give a copy of the base; an empty base gives the increments', () => {
    expect(addCounts({ a: 1 }, {})).toEqual({ a: 1 });
    expect(addCounts({}, { a: 1, b: -2 })).toEqual({ a: 1, b: -2 });
  });
});

describe('applyClaimTally: cost and notes counted once per claim', () => {
  const record = { progress: {}, cost: { usd: 10 }, claimTally: null as ClaimTally | null };

  test('bug 12: a write applied twice (it committed, then a transient error re-ran it) adds its cost and notes once', () => {
    const payload: FlushPayload = { progress: { done: 2 }, cost: { usd: 1.5, calls: 3 }, notes: [{ kind: 'tool', message: 'search' }], notesFrom: 0 };
    const first = applyClaimTally(record, payload, 4);
    expect(first.next.cost).toEqual({ usd: 11.5, calls: 3 });
    expect(first.notes).toEqual([{ kind: 'tool', message: 'search' }]);
    const again = applyClaimTally(first.next, payload, 4);
    expect(again.next.cost).toEqual({ usd: 11.5, calls: 3 });
    expect(again.notes).toEqual([]);
    expect(again.next.progress).toEqual({ done: 2 });
  });

  test('bug 12: a flusher whose write commits and then reports an error never double-counts over many flushes', async () => {
    const clock = new ManualClock();
    const timers = new ManualTimers();
    let stored = record;
    let writes = 0;
    const write = (payload: FlushPayload): Promise<void> => {
      stored = applyClaimTally(stored, payload, 1).next;
      writes += 1;
      // Every other write commits but its caller hears DEADLINE_EXCEEDED.
      return writes % 2 === 1 ? Promise.reject(new Error('DEADLINE_EXCEEDED')) : Promise.resolve();
    };
    const flusher = new CoalescingFlusher(write, options(clock, timers, { onWriteError: jest.fn() }));
    for (let round = 0; round < 6; round += 1) {
      flusher.addCost({ usd: 1 });
      clock.advance(1_000);
      timers.fireAll();
      await settle();
    }
    const pending = await flusher.stop();
    stored = applyClaimTally(stored, pending, 1).next;
    expect(writes).toBeGreaterThan(3);
    expect(stored.cost).toEqual({ usd: 16 });
  });

  test('a new claim starts its own tally; an older claim\'s tally does not hide new cost', () => {
    const earlier = applyClaimTally(record, { progress: {}, cost: { usd: 2 }, notes: [], notesFrom: 0 }, 1).next;
    const later = applyClaimTally(earlier, { progress: {}, cost: { usd: 2 }, notes: [], notesFrom: 0 }, 2).next;
    expect(later.cost).toEqual({ usd: 14 });
    expect(later.claimTally).toEqual({ epoch: 2, cost: { usd: 2 }, notes: 0 });
  });
});
