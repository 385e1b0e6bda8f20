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
  /**
   * Everything this claim has spent so far (a running total, not an increment), so that a write
   * retried after it had in fact committed cannot count the same money twice: see `applyClaimTally`.
   */
  readonly cost: Readonly<Record<string, number>>;
  /** Timeline notes not yet known to be written, the first of them being this claim's note number `notesFrom`. */
  readonly notes: readonly { readonly kind: string; readonly message: string }[];
  readonly notesFrom: number;
}

export const EMPTY_FLUSH: FlushPayload = { progress: {}, cost: {}, notes: [], notesFrom: 0 };

/** What one claim has already made durable on its owner document: its running cost and note count. */
export interface ClaimTally {
  readonly epoch: number;
  readonly cost: Readonly<Record<string, number>>;
  readonly notes: number;
}

/**
 * Applies a payload to a record owned by the claim `epoch`, idempotently: the cost added is the
 * payload's running total minus what this claim already recorded, and notes already written are
 * skipped. Re-running a write whose first commit went through (a transient error after commit)
 * therefore adds nothing twice.
 */
export function applyClaimTally<T extends { readonly progress: Readonly<Record<string, number>>; readonly cost: Readonly<Record<string, number>>; readonly claimTally: ClaimTally | null }>(
  record: T,
  payload: FlushPayload,
  epoch: number,
): { readonly next: T; readonly notes: readonly { readonly kind: string; readonly message: string }[] } {
  const previous = record.claimTally?.epoch === epoch ? record.claimTally : { epoch, cost: {}, notes: 0 };
  const increments: Record<string, number> = {};
  const total: Record<string, number> = { ...previous.cost };
  for (const [key, value] of Object.entries(payload.cost)) {
    const already = previous.cost[key] ?? 0;
    increments[key] = Math.max(0, value - already);
    total[key] = Math.max(value, already);
  }
  const skip = Math.max(0, previous.notes - payload.notesFrom);
  const notes = payload.notes.slice(skip);
  const next: T = {
    ...record,
    progress: { ...record.progress, ...payload.progress },
    cost: addCounts(record.cost, increments),
    claimTally: { epoch, cost: total, notes: Math.max(previous.notes, payload.notesFrom + payload.notes.length) },
  };
  return { next, notes };
}

/** Timer functions, injected so heartbeats and flushes run under a test clock. */
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
  /**
   * When the lease was last renewed before this flusher started (the claim's own stamp): the first
   * heartbeat is due one interval after it, not after the step's loads that came between.
   */
  readonly renewedAtMs?: number;
  /** Called once when a write reports lost ownership: the step must stop. */
  readonly onOwnershipLost: (error: OwnershipLostError) => void;
  /** Called for any other failed write; the payload is kept and retried with the next flush. */
  readonly onWriteError?: (error: unknown) => void;
}

/** How soon a failed heartbeat is tried again. */
const HEARTBEAT_RETRY_MS = 1_000;

export class CoalescingFlusher {
  private progress: Record<string, number> = {};
  /** The claim's running total; never reset, so every write carries all of it. */
  private readonly cost: Record<string, number> = {};
  /** Notes not yet confirmed written, the first being note number `confirmedNotes`. */
  private notes: { kind: string; message: string }[] = [];
  private confirmedNotes = 0;
  private lastFlushAtMs = Number.NEGATIVE_INFINITY;
  /** Whether the last write failed (not for lost ownership): the next heartbeat comes sooner. */
  private lastWriteFailed = false;
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
    this.lastFlushAtMs = options.renewedAtMs ?? Number.NEGATIVE_INFINITY;
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
        this.lastWriteFailed = false;
        this.confirm(payload);
      },
      (error: unknown) => {
        if (error instanceof OwnershipLostError) {
          this.stopped = true;
          this.options.onOwnershipLost(error);
          return;
        }
        this.lastWriteFailed = true;
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

  /**
   * The next heartbeat is due one interval after the last one started, not after it ended, and a
   * failed one is tried again within a second: a slow or failed renewal must not leave the lease
   * silent long enough for a redelivered task to take a live worker's step (stale threshold).
   */
  private armHeartbeat(): void {
    if (this.stopped) return;
    const sinceLastMs = this.options.clock.now() - this.lastFlushAtMs;
    const dueInMs = this.lastWriteFailed
      ? Math.min(HEARTBEAT_RETRY_MS, this.options.heartbeatMs)
      : Math.max(0, this.options.heartbeatMs - (Number.isFinite(sinceLastMs) ? Math.min(sinceLastMs, this.options.heartbeatMs) : 0));
    this.heartbeatTimer = this.timers.setTimeout(() => {
      void this.flushNow().then(() => {
        this.armHeartbeat();
      });
    }, dueInMs);
  }

  /** Progress changed since the last write, the running cost, and every unconfirmed note. */
  private take(): FlushPayload {
    const payload = { progress: this.progress, cost: { ...this.cost }, notes: [...this.notes], notesFrom: this.confirmedNotes };
    this.progress = {};
    return payload;
  }

  private confirm(payload: FlushPayload): void {
    const written = payload.notesFrom + payload.notes.length - this.confirmedNotes;
    if (written <= 0) return;
    this.notes = this.notes.slice(written);
    this.confirmedNotes += written;
  }

  /** A failed write may or may not have committed: keep its progress; cost and notes are re-sent anyway. */
  private restore(payload: FlushPayload): void {
    this.progress = { ...payload.progress, ...this.progress };
  }
}

export function addCounts(base: Readonly<Record<string, number>>, increments: Readonly<Record<string, number>>): Record<string, number> {
  const sum = { ...base };
  for (const [key, value] of Object.entries(increments)) sum[key] = (sum[key] ?? 0) + value;
  return sum;
}
