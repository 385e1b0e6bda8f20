/**
 * The owner's daily spend cap inside one step (core/quota.ts decides, store/quota-documents.ts
 * reads and charges). Before each model call it reads what every worker of the owner charged
 * today, plus what this step charged and has not seen written; after each call it charges the
 * call's cost. Charges are written one after another, and a check waits for the writes before it,
 * so this step never checks against less than it spent: the cap is passed by at most the calls
 * that were already in flight (this one's and other workers') when it was reached.
 */
import type { Clock } from '../core/clock';
import { describeError, SpendLimitReachedError } from '../core/errors';
import type { SpendMeter } from '../core/pipeline';
import { nextSpendResetMs, spendAllowsCall, spendLimitMessage } from '../core/quota';
import type { SpendLedger } from '../store/quota-documents';

export class StepSpendMeter implements SpendMeter {
  private cap: Promise<number> | null = null;
  /** The chain of charge writes; each check waits for it. */
  private writes: Promise<void> = Promise.resolve();
  /** Charged in this step and not yet written (a failed write keeps its amount here for the next). */
  private unwrittenUsd = 0;
  private unwrittenCalls = 0;

  constructor(
    private readonly ledger: SpendLedger,
    private readonly owner: string,
    private readonly clock: Clock,
    private readonly log?: (message: string, detail?: Record<string, unknown>) => void,
  ) {}

  async beforeCall(): Promise<void> {
    await this.writes;
    // The cap is read once per step: an operator's raise reaches the next step (a resumed job is one).
    this.cap ??= this.ledger.capUsd(this.owner).catch((error: unknown) => {
      this.cap = null;
      throw error;
    });
    const capUsd = await this.cap;
    const nowMs = this.clock.now();
    const spentUsd = (await this.ledger.spentUsd(this.owner, nowMs)) + this.unwrittenUsd;
    if (!spendAllowsCall(spentUsd, capUsd)) {
      throw new SpendLimitReachedError(spendLimitMessage(spentUsd, capUsd, nowMs), spentUsd, capUsd, nextSpendResetMs(nowMs));
    }
  }

  charge(usd: number): void {
    if (!(usd > 0)) return;
    this.unwrittenUsd += usd;
    this.unwrittenCalls += 1;
    this.writes = this.writes.then(() => this.writeUnwritten());
  }

  /** At the step's end: every charge written, with one more try for any that failed. */
  async settle(): Promise<void> {
    await this.writes;
    if (this.unwrittenUsd > 0) await this.writeUnwritten();
    if (this.unwrittenUsd > 0) this.log?.('spend charge not written; this step under-counts the owner\'s day', { owner: this.owner, usd: this.unwrittenUsd });
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
      this.log?.('spend charge failed; kept for the next one', { owner: this.owner, usd, error: describeError(error) });
    }
  }
}
