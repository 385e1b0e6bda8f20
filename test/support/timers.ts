import type { Timers } from '../../functions/src/core/flusher';

/** Timers that only fire when the test says so: heartbeats and flushes without real waiting. */
export class ManualTimers implements Timers {
  private nextHandle = 1;
  private readonly pending = new Map<number, { callback: () => void; ms: number }>();

  setTimeout(callback: () => void, ms: number): unknown {
    const handle = this.nextHandle++;
    this.pending.set(handle, { callback, ms });
    return handle;
  }

  clearTimeout(handle: unknown): void {
    this.pending.delete(handle as number);
  }

  get size(): number {
    return this.pending.size;
  }

  /** The delays of the timers set and not yet fired, in the order they were set. */
  get pendingDelays(): number[] {
    return [...this.pending.values()].map((timer) => timer.ms);
  }

  /** Fires every timer set so far (not the ones their callbacks set). */
  fireAll(): void {
    const due = [...this.pending.entries()];
    this.pending.clear();
    for (const [, timer] of due) timer.callback();
  }
}
