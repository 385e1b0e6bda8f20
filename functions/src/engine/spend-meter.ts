/**
 * The owner's daily spend cap inside one step (core/quota.ts decides, store/quota-documents.ts
 * reads and charges). Its first check reads the kind of account, the operator's override and the
 * day's spend in one round trip; every check reads what every worker of the owner charged today
 * and the cap in force (an operator's cut made with `setUserLimits` applies from the next call),
 * plus what this step charged and has not seen written; after each call it charges the call's cost. Charges are
 * written one after another, and a check waits for the writes before it, so this step never checks
 * against less than it spent: the cap is passed by at most the calls that were already in flight
 * (this one's and other workers') when it was reached.
 */
import type { Clock } from '../core/clock';
import { describeError, SpendLimitReachedError } from '../core/errors';
import type { SpendMeter } from '../core/pipeline';
import { nextSpendResetMs, spendAllowsCall, spendLimitMessage } from '../core/quota';
import { UnreadableSpendRecordError, type SpendFacts, type SpendLedger, type SpendToday } from '../store/quota-documents';

/** Waits before the settle's further tries of a charge that could not be written (a transient Firestore error). */
const SETTLE_RETRY_DELAYS_MS = [250, 1_000, 4_000];

export interface SpendMeterOptions {
  readonly log?: (message: string, detail?: Record<string, unknown>) => void;
  /** How the settle waits between tries; real time by default. */
  readonly sleep?: (ms: number) => Promise<void>;
}

export class StepSpendMeter implements SpendMeter {
  /** From the step's first check that succeeded. */
  private facts: SpendFacts | null = null;
  /** The chain of charge writes; each check waits for it. */
  private writes: Promise<void> = Promise.resolve();
  /** Charged in this step and not yet written (a failed write keeps its amount here for the next). */
  private unwrittenUsd = 0;
  private unwrittenCalls = 0;

  constructor(
    private readonly ledger: SpendLedger,
    private readonly owner: string,
    private readonly clock: Clock,
    private readonly options: SpendMeterOptions = {},
  ) {}

  async beforeCall(): Promise<void> {
    await this.writes;
    const nowMs = this.clock.now();
    let today: SpendToday;
    try {
      if (this.facts === null) {
        const first = await this.ledger.firstCheck(this.owner, nowMs);
        this.facts = first.facts;
        today = first.today;
      } else {
        today = await this.ledger.today(this.owner, this.facts, nowMs);
      }
    } catch (error) {
      if (!(error instanceof UnreadableSpendRecordError)) throw error;
      // Nothing is spent against a record nobody can read; the job waits for it to be repaired, it does not fail.
      const message = `This account's spend record cannot be read (${error.message}); an operator must repair it before more model calls are made.`;
      throw new SpendLimitReachedError(message, Number.NaN, Number.NaN, nextSpendResetMs(nowMs));
    }
    const spentUsd = today.spentUsd + this.unwrittenUsd;
    if (!spendAllowsCall(spentUsd, today.capUsd)) {
      throw new SpendLimitReachedError(spendLimitMessage(spentUsd, today.capUsd, nowMs), spentUsd, today.capUsd, nextSpendResetMs(nowMs));
    }
  }

  charge(usd: number): void {
    if (!(usd > 0)) return;
    this.unwrittenUsd += usd;
    this.unwrittenCalls += 1;
    this.writes = this.writes.then(() => this.writeUnwritten());
  }

  /** At the step's end: every charge written, tried again a few times (backing off) when a write failed. */
  async settle(): Promise<void> {
    await this.writes;
    const sleep = this.options.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)));
    for (const delayMs of SETTLE_RETRY_DELAYS_MS) {
      if (this.unwrittenUsd <= 0) return;
      await sleep(delayMs);
      await this.writeUnwritten();
    }
    if (this.unwrittenUsd > 0) this.options.log?.("spend charge not written; the owner's day is under-counted by it", { owner: this.owner, usd: this.unwrittenUsd });
  }

  private async writeUnwritten(): Promise<void> {
    const usd = this.unwrittenUsd;
    const calls = this.unwrittenCalls;
    if (usd <= 0) return;
    try {
      await this.ledger.charge(this.owner, { usd, calls }, this.clock.now());
      this.unwrittenUsd -= usd;
      this.unwrittenCalls -= calls;
    } catch (error) {
      // Kept: the next charge (or the step's settle) writes it, and checks count it meanwhile.
      this.options.log?.('spend charge failed; kept for the next one', { owner: this.owner, usd, error: describeError(error) });
    }
  }
}
