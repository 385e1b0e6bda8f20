/**
 * Coalesces progress, cost and timeline notes with the lease heartbeat, so the hot document sees
 * at most one write per `minIntervalMs` however fast sections finish, and at least one per
 * `heartbeatMs` while the step runs.
 */
import type { Clock } from './clock';
import { OwnershipLostError } from './errors';

export interface FlushPayload {
  /** Absolute figures to merge; empty when nothing changed. */
  readonly progress: Readonly<Record<string, number>>;
  /** Increments to add. */
  readonly cost: Readonly<Record<string, number>>;
  readonly notes: readonly { readonly kind: string; readonly message: string }[];
}

export interface Timers {
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const realTimers: Timers = {
  setTimeout: (callback, ms) => setTimeout(callback, ms),
  clearTimeout: (handle) => {
    clearTimeout(handle as ReturnType<typeof setTimeout>);
  },
};

export interface FlusherOptions {
  readonly minIntervalMs: number;
  readonly heartbeatMs: number;
  readonly clock: Clock;
  readonly timers?: Timers;
  /** Called once when a write reports lost ownership: the step must stop. */
  readonly onOwnershipLost: (error: OwnershipLostError) => void;
  /** Called for any other failed write; the payload is kept and retried with the next flush. */
  readonly onWriteError?: (error: unknown) => void;
}

export class CoalescingFlusher {
  private progress: Record<string, number> = {};
  private cost: Record<string, number> = {};
  private notes: { kind: string; message: string }[] = [];
  private lastFlushAtMs = Number.NEGATIVE_INFINITY;
  private flushTimer: unknown = undefined;
  private heartbeatTimer: unknown = undefined;
  private inFlight: Promise<void> | undefined;
  private stopped = false;
  private readonly timers: Timers;
  /** Writes made, for the write-rate benchmark and tests. */
  writes = 0;

  constructor(
    private readonly write: (payload: FlushPayload) => Promise<void>,
    private readonly options: FlusherOptions,
  ) {
    this.timers = options.timers ?? realTimers;
  }

  start(): void {
    this.armHeartbeat();
  }

  reportProgress(values: Readonly<Record<string, number>>): void {
    Object.assign(this.progress, values);
    this.schedule();
  }

  addCost(increments: Readonly<Record<string, number>>): void {
    for (const [key, value] of Object.entries(increments)) this.cost[key] = (this.cost[key] ?? 0) + value;
    this.schedule();
  }

  note(kind: string, message: string): void {
    this.notes.push({ kind, message });
    this.schedule();
  }

  /** Stops the timers, waits for a write in flight, and hands back what was never written. */
  async stop(): Promise<FlushPayload> {
    this.stopped = true;
    if (this.flushTimer !== undefined) this.timers.clearTimeout(this.flushTimer);
    if (this.heartbeatTimer !== undefined) this.timers.clearTimeout(this.heartbeatTimer);
    await this.inFlight;
    return this.take();
  }

  /** Writes now whatever is pending (a heartbeat if nothing is). */
  async flushNow(): Promise<void> {
    while (this.inFlight) await this.inFlight;
    if (this.stopped) return;
    const payload = this.take();
    this.lastFlushAtMs = this.options.clock.now();
    this.inFlight = this.write(payload).then(
      () => {
        this.writes += 1;
      },
      (error: unknown) => {
        if (error instanceof OwnershipLostError) {
          this.stopped = true;
          this.options.onOwnershipLost(error);
          return;
        }
        this.restore(payload);
        this.options.onWriteError?.(error);
      },
    );
    const flight = this.inFlight;
    await flight;
    if (this.inFlight === flight) this.inFlight = undefined;
  }

  private schedule(): void {
    if (this.stopped || this.flushTimer !== undefined) return;
    const waitMs = Math.max(0, this.lastFlushAtMs + this.options.minIntervalMs - this.options.clock.now());
    this.flushTimer = this.timers.setTimeout(() => {
      this.flushTimer = undefined;
      void this.flushNow();
    }, waitMs);
  }

  private armHeartbeat(): void {
    if (this.stopped) return;
    this.heartbeatTimer = this.timers.setTimeout(() => {
      void this.flushNow().then(() => {
        this.armHeartbeat();
      });
    }, this.options.heartbeatMs);
  }

  private take(): FlushPayload {
    const payload = { progress: this.progress, cost: this.cost, notes: this.notes };
    this.progress = {};
    this.cost = {};
    this.notes = [];
    return payload;
  }

  private restore(payload: FlushPayload): void {
    this.progress = { ...payload.progress, ...this.progress };
    for (const [key, value] of Object.entries(payload.cost)) this.cost[key] = (this.cost[key] ?? 0) + value;
    this.notes = [...payload.notes, ...this.notes];
  }
}

export function addCounts(base: Readonly<Record<string, number>>, increments: Readonly<Record<string, number>>): Record<string, number> {
  const sum = { ...base };
  for (const [key, value] of Object.entries(increments)) sum[key] = (sum[key] ?? 0) + value;
  return sum;
}
