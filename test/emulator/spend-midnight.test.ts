/** The spend check across UTC midnight: which override a step already running applies after it (the day's copy, or userLimits as its first check read it). */
import { ManualClock } from '../../functions/src/core/clock';
import { SpendLimitReachedError } from '../../functions/src/core/errors';
import { DEFAULT_QUOTA_DEFAULTS, spendDay } from '../../functions/src/core/quota';
import { StepSpendMeter } from '../../functions/src/engine/spend-meter';
import { SPEND_CHARGES, spendDayPath, userLimitsPath } from '../../functions/src/store/paths';
import { setUserLimits, SpendLedger } from '../../functions/src/store/quota-documents';
import { openTestFirestore, type TestFirestore } from '../support/firestore';
import { answerLostAfterFirstCommit } from '../support/interpose';

let firestore: TestFirestore;
beforeAll(() => {
  firestore = openTestFirestore('spend-midnight');
});
beforeEach(() => firestore.reset());
afterAll(() => firestore.close());

const db = () => firestore.db;
const ledger = () => new SpendLedger(db(), DEFAULT_QUOTA_DEFAULTS);
const verdict = (meter: StepSpendMeter) =>
  meter.beforeCall().then(
    () => 'allowed',
    (error: unknown) => (error instanceof SpendLimitReachedError ? 'refused' : `error: ${String(error)}`),
  );

test('a cut set the day before (copy only on today) still applies after midnight in a step in flight', async () => {
  const clock = new ManualClock(Date.UTC(2026, 11, 1, 23, 59));
  const uid = 'cut-yesterday';
  await setUserLimits(db(), uid, { spendUsdPerDay: 2 }, clock.now() - 86_400_000); // copies on Nov 30 and Dec 1
  const meter = new StepSpendMeter(ledger(), uid, clock);
  expect(await verdict(meter)).toBe('allowed');
  clock.advance(2 * 60_000); // Dec 2, no copy there
  await ledger().charge(uid, { id: 'another-worker', usd: 3, calls: 1 }, clock.now());
  expect(await verdict(meter)).toBe('refused');
});

test('a raise made during the step before midnight applies after midnight; a direct edit made before the step applies across midnight', async () => {
  const clock = new ManualClock(Date.UTC(2026, 11, 1, 23, 59));
  const uid = 'raise-in-flight';
  await setUserLimits(db(), uid, { spendUsdPerDay: 1_000 }, clock.now()); // copies Dec 1, Dec 2
  await db().doc(userLimitsPath(uid)).set({ spendUsdPerDay: 1, updatedAtMs: clock.now() }); // direct cut, no copy
  const meter = new StepSpendMeter(ledger(), uid, clock);
  expect(await verdict(meter)).toBe('allowed'); // $0 spent of $1
  clock.advance(2 * 60_000);
  await ledger().charge(uid, { id: 'another-worker', usd: 5, calls: 1 }, clock.now());
  // Dec 2's copy ($1000) equals Dec 1's as the first check saw it: the direct cut ($1) stands.
  expect(await verdict(meter)).toBe('refused');

  const clock2 = new ManualClock(Date.UTC(2026, 11, 5, 23, 59));
  const uid2 = 'raise-before-midnight';
  await setUserLimits(db(), uid2, { spendUsdPerDay: 1 }, clock2.now());
  const meter2 = new StepSpendMeter(ledger(), uid2, clock2);
  expect(await verdict(meter2)).toBe('allowed');
  await setUserLimits(db(), uid2, { spendUsdPerDay: 1_000 }, clock2.now());
  clock2.advance(2 * 60_000);
  await ledger().charge(uid2, { id: 'another-worker', usd: 5, calls: 1 }, clock2.now());
  expect(await verdict(meter2)).toBe('allowed');
});

test('a charge whose answer was lost just before midnight is sent again after it to the day it was made, once, and not counted against the new day', async () => {
  const clock = new ManualClock(Date.UTC(2026, 11, 1, 23, 59, 59));
  const uid = 'lost-at-midnight';
  await setUserLimits(db(), uid, { spendUsdPerDay: 0.5 }, clock.now());
  const before = spendDay(clock.now());
  const meter = new StepSpendMeter(ledger(), uid, clock, { chargeScope: 'job-1~job~epoch1', sleep: () => Promise.resolve() });
  expect(await verdict(meter)).toBe('allowed');
  const lost = answerLostAfterFirstCommit((paths) => paths.includes(spendDayPath(uid, before)));
  try {
    meter.charge(0.4);
    await new Promise((resolve) => setImmediate(resolve)); // its write is made up on Dec 1 and on its way; the answer will be lost
    clock.advance(2_000); // Dec 2
    meter.charge(0.3); // its write goes out after the lost one is sent again
    expect(await verdict(meter)).toBe('allowed'); // $0.30 of Dec 2's $0.50
    await meter.settle();
  } finally {
    lost.restore();
  }
  expect(lost.ran()).toBe(true);
  const usd = async (day: string) => ((await db().doc(spendDayPath(uid, day)).get()).get('usd') as number | undefined) ?? 0;
  expect(await usd(before)).toBeCloseTo(0.4, 9);
  expect(await usd(spendDay(clock.now()))).toBeCloseTo(0.3, 9);
  expect((await db().collection(`${spendDayPath(uid, before)}/${SPEND_CHARGES}`).get()).size).toBe(1);
});
