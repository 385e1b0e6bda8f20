/**
 * One step's view of its owner's daily spend cap (engine/spend-meter.ts) over a ledger kept in
 * memory: the check counts what every worker charged plus what this step has not seen written,
 * charges are written one after another, and a failed write is kept, never lost.
 */
import { ManualClock } from '../../functions/src/core/clock';
import { SpendLimitReachedError } from '../../functions/src/core/errors';
import { nextSpendResetMs } from '../../functions/src/core/quota';
import { StepSpendMeter } from '../../functions/src/engine/spend-meter';
import { UnreadableSpendRecordError, type SpendLedger } from '../../functions/src/store/quota-documents';

class MemoryLedger {
  spent = 0;
  calls = 0;
  factsReads = 0;
  todayReads = 0;
  failNextCharges = 0;
  /** A malformed spend document: the read says so. */
  unreadable = false;
  /** Resolves the charges held back, in order. */
  held: (() => void)[] = [];
  holdCharges = false;

  constructor(public cap: number) {}

  async firstCheck(): Promise<{ facts: { anonymous: boolean; override: null; copySeen: string }; today: { spentUsd: number; capUsd: number } }> {
    this.factsReads += 1;
    return { facts: { anonymous: false, override: null, copySeen: 'absent' }, today: await this.today() };
  }

  today(): Promise<{ spentUsd: number; capUsd: number }> {
    this.todayReads += 1;
    if (this.unreadable) return Promise.reject(new UnreadableSpendRecordError('quotaUsage/user-1/spendDays/2026-12-01 is malformed: usd: expected number'));
    return Promise.resolve({ spentUsd: this.spent, capUsd: this.cap });
  }

  async charge(_uid: string, spent: { usd: number; calls: number }): Promise<void> {
    if (this.holdCharges) await new Promise<void>((resolve) => this.held.push(resolve));
    if (this.failNextCharges > 0) {
      this.failNextCharges -= 1;
      throw new Error('UNAVAILABLE');
    }
    this.spent += spent.usd;
    this.calls += spent.calls;
  }
}

const clock = new ManualClock(Date.UTC(2026, 11, 1, 12));
const meterOver = (ledger: MemoryLedger, log?: (message: string) => void) =>
  new StepSpendMeter(ledger as unknown as SpendLedger, 'user-1', clock, { sleep: () => Promise.resolve(), ...(log ? { log } : {}) });

test('a call starts while the day is under the cap, and is refused once it is reached, with when it resets', async () => {
  const ledger = new MemoryLedger(1);
  const meter = meterOver(ledger);
  await meter.beforeCall();
  meter.charge(0.6);
  await meter.beforeCall();
  meter.charge(0.4);
  const refused = await meter.beforeCall().catch((error: unknown) => error);
  expect(refused).toBeInstanceOf(SpendLimitReachedError);
  expect(refused).toMatchObject({ spentUsd: 1, capUsd: 1, resetAtMs: nextSpendResetMs(clock.now()) });
  expect((refused as Error).message).toBe("Today's model spend of $1.00 reached this account's daily limit of $1.00; it resets at 2026-12-02 00:00 UTC.");
  // The kind of account is read once per step; the day's spend and the cap before every call.
  expect(ledger.factsReads).toBe(1);
  expect(ledger.todayReads).toBe(3);
});

test("an operator's cut applies from the next call, not the next step", async () => {
  const ledger = new MemoryLedger(10);
  const meter = meterOver(ledger);
  await meter.beforeCall();
  meter.charge(2);
  ledger.cap = 0.5;
  await expect(meter.beforeCall()).rejects.toBeInstanceOf(SpendLimitReachedError);
});

test('an unreadable spend record stops the calls (a wait for an operator), never lets them through', async () => {
  const ledger = new MemoryLedger(10);
  ledger.unreadable = true;
  const refused = await meterOver(ledger).beforeCall().catch((error: unknown) => error);
  expect(refused).toBeInstanceOf(SpendLimitReachedError);
  expect((refused as Error).message).toMatch(/^This account's spend record cannot be read \(.*malformed.*\); an operator must repair it/);
});

test('the settle tries a charge again, backing off, until it is written', async () => {
  const ledger = new MemoryLedger(10);
  const meter = meterOver(ledger);
  ledger.failNextCharges = 3;
  meter.charge(3);
  await meter.settle();
  expect(ledger.spent).toBe(3);
});

test("another worker's charges count: the check reads the day as every worker left it", async () => {
  const ledger = new MemoryLedger(1);
  const meter = meterOver(ledger);
  await meter.beforeCall();
  ledger.spent = 1.2;
  await expect(meter.beforeCall()).rejects.toBeInstanceOf(SpendLimitReachedError);
});

test('a check waits for the charges before it: a charge still on its way is never missed', async () => {
  const ledger = new MemoryLedger(1);
  ledger.holdCharges = true;
  const meter = meterOver(ledger);
  meter.charge(2);
  let settled = false;
  const check = meter.beforeCall().then(
    () => (settled = true),
    (error: unknown) => {
      settled = true;
      throw error;
    },
  );
  await new Promise((resolve) => setImmediate(resolve));
  expect(settled).toBe(false);
  ledger.held.shift()?.();
  await expect(check).rejects.toBeInstanceOf(SpendLimitReachedError);
  expect(ledger.spent).toBe(2);
});

test('a failed charge is kept: checks count it, and the next charge (or the settle) writes it', async () => {
  const ledger = new MemoryLedger(1);
  const logged: string[] = [];
  const meter = meterOver(ledger, (message) => logged.push(message));
  ledger.failNextCharges = 1;
  meter.charge(0.7);
  await meter.beforeCall();
  expect(ledger.spent).toBe(0);
  expect(logged).toEqual(['spend charge failed; kept for the next one']);
  meter.charge(0.5);
  await expect(meter.beforeCall()).rejects.toBeInstanceOf(SpendLimitReachedError);
  expect(ledger.spent).toBeCloseTo(1.2, 9);
  expect(ledger.calls).toBe(2);

  ledger.failNextCharges = 1;
  meter.charge(0.1);
  await meter.settle();
  expect(ledger.spent).toBeCloseTo(1.3, 9);
});

test('a charge that could not be written still counts against the cap in this step', async () => {
  const ledger = new MemoryLedger(1);
  const meter = meterOver(ledger);
  ledger.failNextCharges = 1;
  meter.charge(1.5);
  await expect(meter.beforeCall()).rejects.toMatchObject({ spentUsd: 1.5 });
  expect(ledger.spent).toBe(0);
});

test('calls that cost nothing are not written', async () => {
  const ledger = new MemoryLedger(1);
  const meter = meterOver(ledger);
  meter.charge(0);
  await meter.settle();
  expect(ledger.calls).toBe(0);
});
