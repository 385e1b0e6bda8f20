/**
 * The owner's daily spend cap inside one step (core/quota.ts decides, store/quota-documents.ts
 * reads and charges). Its first check reads the kind of account, the operator's override and the
 * day's spend in one round trip; every check reads what every worker of the owner charged today
 * and the cap in force (an operator's cut made with `setUserLimits` applies from the next check read),
 * plus what this step charged and has not seen written; after each call it charges the call's cost. Charges are
 * written one after another, and a check waits for the writes before it, so this step never checks
 * against less than it spent: the cap is passed by at most one call per worker of the owner (the
 * one running, or about to start on a check already read, when the cap was reached).
 *
 * A check may be read ahead (`readAhead`): started as soon as the call before it ended, beside the
 * saves and tool calls that come between two model calls, instead of after them. It is then the
 * check the next call starts on, as if read at that moment: nothing this step charges can come
 * between (no call ends in between; a charge made all the same drops the read-ahead, and the check
 * is read again), and a read from an earlier spend day is read again too.
 *
 * Each write has an identity (the step's scope and the write's sequence number) and is tried
 * again as it was, never merged into a later one: a write whose commit landed but whose answer was
 * lost is recognised when it is sent again, so it counts once; a check asks whether such writes
 * landed in the same read as the day, so it does not count them twice either.
 */
import { randomUUID } from 'node:crypto';
import type { Clock } from '../core/clock';
import { describeError, SpendLimitReachedError } from '../core/errors';
import type { SpendMeter } from '../core/pipeline';
import { nextSpendResetMs, spendAllowsCall, spendLimitMessage } from '../core/quota';
import { UnreadableSpendRecordError, type SpendCharge, type SpendFacts, type SpendLedger, type SpendToday } from '../store/quota-documents';

/** Waits before the settle's further tries of a charge that could not be written (a transient Firestore error). */
const SETTLE_RETRY_DELAYS_MS = [250, 1_000, 4_000];

export interface SpendMeterOptions {
  readonly log?: (message: string, detail?: Record<string, unknown>) => void;
  /** How the settle waits between tries; real time by default. */
  readonly sleep?: (ms: number) => Promise<void>;
  /**
   * What names this meter's charges, unique to the charging step (the job, its claim slot and
   * epoch): each write's ID is this and its sequence number. Without it, a random one.
   */
  readonly chargeScope?: string;
}

/** A write of some charges, made once and tried again unchanged until it is known to have landed. */
interface PendingWrite extends SpendCharge {
  /** When its charges were made: the day they count against, however late the write lands. */
  readonly atMs: number;
}

/** The scope of a step's charges: its job, its claim slot (`job`, or the unit's `{phase}~{unit}`) and the claim's epoch. */
export function stepChargeScope(jobId: string, slot: string, epoch: number): string {
  return `${jobId}~${slot}~epoch${epoch}`;
}

export class StepSpendMeter implements SpendMeter {
  /** From the step's first check that succeeded. */
  private facts: SpendFacts | null = null;
  /** The chain of charge writes; each check waits for it. */
  private writes: Promise<void> = Promise.resolve();
  /** Charged since the last write was made up, not yet in one. */
  private newUsd = 0;
  private newCalls = 0;
  /** Writes made up and not known to have landed, oldest first (a failed one is kept for the next try). */
  private pending: PendingWrite[] = [];
  private sequence = 0;
  private readonly scope: string;
  /** A check read ahead for the next call, with the charge count it was started at (see readAhead). */
  private ahead: { readonly read: Promise<SpendToday>; readonly atMs: number; readonly charges: number } | null = null;
  /** Charges made so far: a read-ahead started before one is not the next call's check. */
  private charges = 0;

  constructor(
    private readonly ledger: SpendLedger,
    private readonly owner: string,
    private readonly clock: Clock,
    private readonly options: SpendMeterOptions = {},
  ) {
    this.scope = options.chargeScope ?? randomUUID();
  }

  async beforeCall(): Promise<void> {
    const nowMs = this.clock.now();
    const ahead = this.ahead;
    this.ahead = null;
    // A read-ahead is this call's check when nothing was charged since it started and the spend day has not turned.
    const usable = ahead !== null && ahead.charges === this.charges && nextSpendResetMs(ahead.atMs) > nowMs;
    let today: SpendToday;
    try {
      today = await (usable ? ahead.read : this.read(nowMs));
    } catch (error) {
      if (!(error instanceof UnreadableSpendRecordError)) throw error;
      // Nothing is spent against a record nobody can read; the job waits for it to be repaired, it does not fail.
      const message = `This account's spend record cannot be read (${error.message}); an operator must repair it before more model calls are made.`;
      throw new SpendLimitReachedError(message, Number.NaN, Number.NaN, nextSpendResetMs(nowMs));
    }
    const spentUsd = today.spentUsd + this.unwrittenUsd();
    if (!spendAllowsCall(spentUsd, today.capUsd)) {
      throw new SpendLimitReachedError(spendLimitMessage(spentUsd, today.capUsd, nowMs), spentUsd, today.capUsd, nextSpendResetMs(nowMs));
    }
  }

  /**
   * Starts reading the next call's check now, beside whatever comes before that call (the saves of
   * the answer before it, its tool calls), so that the call does not wait for it. Call it only when a
   * model call will follow (its read is wasted otherwise); a second one before that call does nothing.
   */
  readAhead(): void {
    if (this.ahead !== null && this.ahead.charges === this.charges) return;
    const atMs = this.clock.now();
    const read = this.read(atMs);
    // Awaited by the next beforeCall, which reports its failure; dropped unread, it must not be an unhandled rejection.
    read.catch(() => undefined);
    this.ahead = { read, atMs, charges: this.charges };
  }

  /** What the owner spent today and the cap in force, once this step's charges before it are written. */
  private async read(nowMs: number): Promise<SpendToday> {
    await this.writes;
    if (this.facts === null) {
      const first = await this.ledger.firstCheck(this.owner, nowMs);
      this.facts = first.facts;
      return first.today;
    }
    // Writes that failed may have landed all the same (their answer lost): the same read tells.
    const asked = [...this.pending];
    const read = await this.ledger.today(this.owner, this.facts, nowMs, asked);
    this.settled(asked.filter((write) => read.landed.has(write.id)));
    return read;
  }

  charge(usd: number): void {
    if (!(usd > 0)) return;
    this.charges += 1;
    this.newUsd += usd;
    this.newCalls += 1;
    this.writeInTurn();
  }

  /** At the step's end: every charge written, tried again a few times (backing off) when a write failed. */
  async settle(): Promise<void> {
    await this.allWritten();
    const sleep = this.options.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)));
    for (const delayMs of SETTLE_RETRY_DELAYS_MS) {
      if (this.unwrittenUsd() <= 0) return;
      await sleep(delayMs);
      this.writeInTurn();
      await this.allWritten();
    }
    if (this.unwrittenUsd() > 0) this.options.log?.("spend charge not written; the owner's day is under-counted by it", { owner: this.owner, usd: this.unwrittenUsd() });
  }

  private unwrittenUsd(): number {
    return this.pending.reduce((sum, write) => sum + write.usd, this.newUsd);
  }

  /** Writes run one at a time, in the order asked for. */
  private writeInTurn(): void {
    this.writes = this.writes.then(() => this.writeUnwritten());
  }

  /** Waits for the chain, including writes a charge made while it waited added to it. */
  private async allWritten(): Promise<void> {
    let waited: Promise<void> | null = null;
    while (waited !== this.writes) {
      waited = this.writes;
      await waited;
    }
  }

  private settled(writes: readonly PendingWrite[]): void {
    if (writes.length > 0) this.pending = this.pending.filter((write) => !writes.includes(write));
  }

  private async writeUnwritten(): Promise<void> {
    if (this.newUsd > 0) {
      this.sequence += 1;
      this.pending.push({ id: `${this.scope}~${this.sequence}`, usd: this.newUsd, calls: this.newCalls, atMs: this.clock.now() });
      this.newUsd = 0;
      this.newCalls = 0;
    }
    for (const write of [...this.pending]) {
      // A check may have found it landed meanwhile.
      if (!this.pending.includes(write)) continue;
      try {
        await this.ledger.charge(this.owner, { id: write.id, usd: write.usd, calls: write.calls }, write.atMs);
        this.settled([write]);
      } catch (error) {
        // Kept as it is: the next charge (or the step's settle) writes it again under its ID, and checks count it meanwhile.
        this.options.log?.('spend charge failed; kept for the next one', { owner: this.owner, usd: write.usd, charge: write.id, error: describeError(error) });
        return;
      }
    }
  }
}
