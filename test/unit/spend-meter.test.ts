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

  today(_uid?: string, _facts?: unknown, _nowMs?: number, unsettled: readonly { id: string }[] = []): Promise<{ spentUsd: number; capUsd: number; landed: Set<string> }> {
    this.todayReads += 1;
    if (this.unreadable) return Promise.reject(new UnreadableSpendRecordError('quotaUsage/user-1/spendDays/2026-12-01 is malformed: usd: expected number'));
    return Promise.resolve({ spentUsd: this.spent, capUsd: this.cap, landed: new Set(unsettled.map((charge) => charge.id).filter((id) => this.chargeIds.has(id))) });
  }

  /** The IDs of the charges that landed: the same ID again adds nothing, as the spend day's records do. */
  readonly chargeIds = new Set<string>();
  /** Charges that land and then fail, as a commit whose answer was lost. */
  loseNextAnswers = 0;

  async charge(_uid: string, spent: { id: string; usd: number; calls: number }): Promise<void> {
    if (this.holdCharges) await new Promise<void>((resolve) => this.held.push(resolve));
    if (this.failNextCharges > 0) {
      this.failNextCharges -= 1;
      throw new Error('UNAVAILABLE');
    }
    if (this.chargeIds.has(spent.id)) return;
    this.chargeIds.add(spent.id);
    this.spent += spent.usd;
    this.calls += spent.calls;
    if (this.loseNextAnswers > 0) {
      this.loseNextAnswers -= 1;
      throw new Error('DEADLINE_EXCEEDED');
    }
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

test('bug 22: a charge whose write landed but whose answer was lost is counted once, by the day and by the checks', async () => {
  const ledger = new MemoryLedger(1.2);
  const meter = meterOver(ledger);
  await meter.beforeCall();
  ledger.loseNextAnswers = 1;
  meter.charge(0.5);
  // The check reads whether the write landed in the same read as the day: $0.50 spent, not $1.00 (a $0.90 cap lets the call start).
  ledger.cap = 0.9;
  await meter.beforeCall();
  ledger.cap = 1.2;
  meter.charge(0.5);
  await meter.beforeCall();
  await meter.settle();
  expect(ledger.spent).toBeCloseTo(1, 9);
  expect(ledger.calls).toBe(2);
});

test('bug 22: a write tried again after a lost answer is the same write (its ID and amount), never merged with later charges', async () => {
  const ledger = new MemoryLedger(10);
  const written: { id: string; usd: number }[] = [];
  const charge = ledger.charge.bind(ledger);
  ledger.charge = (uid, spent) => {
    written.push({ id: spent.id, usd: spent.usd });
    return charge(uid, spent);
  };
  const meter = new StepSpendMeter(ledger as unknown as SpendLedger, 'user-1', clock, { sleep: () => Promise.resolve(), chargeScope: 'job-1~job~epoch3' });
  ledger.loseNextAnswers = 1;
  ledger.holdCharges = true;
  meter.charge(0.5);
  await new Promise((resolve) => setImmediate(resolve));
  // A charge made while the first write is on its way: it goes in a write of its own.
  ledger.holdCharges = false;
  meter.charge(0.25);
  ledger.held.shift()?.();
  await meter.settle();
  expect(written).toEqual([
    { id: 'job-1~job~epoch3~1', usd: 0.5 },
    { id: 'job-1~job~epoch3~1', usd: 0.5 },
    { id: 'job-1~job~epoch3~2', usd: 0.25 },
  ]);
  expect(ledger.spent).toBeCloseTo(0.75, 9);
});

describe('a check read ahead (readAhead: beside the saves and tool calls before the next call)', () => {
  test('is the next call\'s check: one read of the day, not two, and it refuses a call past the cap', async () => {
    const ledger = new MemoryLedger(1);
    const meter = meterOver(ledger);
    meter.readAhead();
    meter.readAhead();
    await meter.beforeCall();
    expect(ledger.factsReads).toBe(1);
    expect(ledger.todayReads).toBe(1);
    meter.charge(0.4);
    meter.readAhead();
    ledger.spent += 0.7; // another worker's charges, landed before the read
    await expect(meter.beforeCall()).rejects.toMatchObject({ spentUsd: 1.1, capUsd: 1 });
    expect(ledger.todayReads).toBe(2);
  });

  test('waits for the charges before it, like any check', async () => {
    const ledger = new MemoryLedger(1);
    ledger.holdCharges = true;
    const meter = meterOver(ledger);
    await meter.beforeCall();
    meter.charge(2);
    meter.readAhead();
    await new Promise((resolve) => setImmediate(resolve));
    expect(ledger.todayReads).toBe(1);
    ledger.held.shift()?.();
    await expect(meter.beforeCall()).rejects.toMatchObject({ spentUsd: 2 });
  });

  test('a charge made after it started drops it: the call\'s check is read again and counts that charge', async () => {
    const ledger = new MemoryLedger(1);
    const meter = meterOver(ledger);
    await meter.beforeCall();
    meter.readAhead();
    await new Promise((resolve) => setImmediate(resolve));
    // The read-ahead has read the day; this charge lands after it, so that read does not count it.
    meter.charge(1.5);
    await new Promise((resolve) => setImmediate(resolve));
    expect(ledger.spent).toBe(1.5);
    await expect(meter.beforeCall()).rejects.toMatchObject({ spentUsd: 1.5 });
    expect(ledger.todayReads).toBe(3);
  });

  test('read on the spend day before the call\'s is read again on the call\'s day', async () => {
    const dayClock = new ManualClock(Date.UTC(2026, 11, 1, 23, 59, 59));
    const ledger = new MemoryLedger(1);
    const meter = new StepSpendMeter(ledger as unknown as SpendLedger, 'user-1', dayClock, { sleep: () => Promise.resolve() });
    await meter.beforeCall();
    meter.readAhead();
    await new Promise((resolve) => setImmediate(resolve));
    dayClock.advance(2_000);
    await meter.beforeCall();
    expect(ledger.todayReads).toBe(3);
  });
});
