/**
 * The operator's override as the spend checks see it: `setUserLimits` copies it into today's and
 * tomorrow's spend days, which every check before a model call reads; a step's first check also
 * reads `userLimits` itself.
 */
import { ManualClock } from '../../functions/src/core/clock';
import { SpendLimitReachedError } from '../../functions/src/core/errors';
import { DEFAULT_QUOTA_DEFAULTS, spendDay } from '../../functions/src/core/quota';
import { StepSpendMeter } from '../../functions/src/engine/spend-meter';
import { spendDayPath, userLimitsPath } from '../../functions/src/store/paths';
import { readUserLimits, setUserLimits, SpendLedger } from '../../functions/src/store/quota-documents';
import { openTestFirestore, type TestFirestore } from '../support/firestore';

let firestore: TestFirestore;
beforeAll(() => {
  firestore = openTestFirestore('spend-limits-copy');
});
beforeEach(() => firestore.reset());
afterAll(() => firestore.close());

const db = () => firestore.db;
// Noon UTC: no midnight in these tests.
const clock = new ManualClock(Date.UTC(2026, 11, 1, 12));
// The defaults the deployment runs with: $10 a day for a signed-in account.
const ledger = () => new SpendLedger(db(), DEFAULT_QUOTA_DEFAULTS);
/** A new step's check before its first model call: resolves when the call may start. */
const newStepMayCall = (uid: string): Promise<string> =>
  new StepSpendMeter(ledger(), uid, clock).beforeCall().then(
    () => 'call allowed',
    (error: unknown) => (error instanceof SpendLimitReachedError ? `refused: ${error.message}` : `error: ${String(error)}`),
  );

test('clearing one limit with setUserLimits replaces the spend days\' copy as a whole: the checks apply the default the operator is shown', async () => {
  const uid = 'user-raised-then-cleared';
  // An operator raised the user's cap for a demo, then clears that raise (back to the default $10), keeping the jobs limit.
  await setUserLimits(db(), uid, { spendUsdPerDay: 1_000, jobsInFlight: 4 }, clock.now());
  await ledger().charge(uid, { id: 'earlier-calls', usd: 50, calls: 10 }, clock.now());
  // A step in flight: its first check passed under the raise.
  const running = new StepSpendMeter(ledger(), uid, clock);
  await running.beforeCall();
  await setUserLimits(db(), uid, { spendUsdPerDay: null }, clock.now());
  // Its next check reads the new copy of the override: the default applies from the next call.
  await expect(running.beforeCall()).rejects.toBeInstanceOf(SpendLimitReachedError);

  const view = await readUserLimits(db(), DEFAULT_QUOTA_DEFAULTS, uid);
  const { today } = await ledger().firstCheck(uid, clock.now());
  const check = await newStepMayCall(uid);

  // What the operator was told is in force: the default $10.
  expect(view.override).not.toHaveProperty('spendUsdPerDay');
  expect(view.signedIn.spendUsdPerDay).toBe(10);
  // The promise: the check before every call applies the same cap, so $50 spent refuses the next call.
  expect(today.capUsd).toBe(10);
  expect(check).toMatch(/^refused/);
});

test('a userLimits document edited by other means applies from the next step, even on days that hold an older copy', async () => {
  const uid = 'user-edited-directly';
  await setUserLimits(db(), uid, { spendUsdPerDay: 1_000 }, clock.now());
  await ledger().charge(uid, { id: 'earlier-calls', usd: 50, calls: 10 }, clock.now());
  // An operator cuts the user off by editing the override directly (the console, a script).
  await db().doc(userLimitsPath(uid)).set({ spendUsdPerDay: 0, updatedAtMs: clock.now() });

  const nextStep = await newStepMayCall(uid);
  clock.advance(86_400_000);
  const tomorrowStep = await newStepMayCall(uid);
  clock.advance(-86_400_000);
  expect(nextStep).toMatch(/^refused/);
  expect(tomorrowStep).toMatch(/^refused/);
});

test('a malformed spend day makes calls wait, and setUserLimits (any limit) does not turn it into $0 spent', async () => {
  const uid = 'user-malformed-day';
  const dayRef = db().doc(spendDayPath(uid, spendDay(clock.now())));
  await setUserLimits(db(), uid, { spendUsdPerDay: 5 }, clock.now());
  // Unreadable: nobody knows what the day spent (say $40, written as a string by a broken tool).
  await dayRef.set({ usd: '40.00', calls: 12 }, { merge: true });
  const before = await newStepMayCall(uid);

  // An operator changes an unrelated limit (the number of jobs in flight); the spend record is not repaired by anyone.
  await setUserLimits(db(), uid, { jobsInFlight: 2 }, clock.now());
  const after = await newStepMayCall(uid);
  // The spend is left as it was: still unreadable.
  expect((await dayRef.get()).get('usd')).toBe('40.00');

  expect(before).toMatch(/^refused: This account's spend record cannot be read/);
  // The promise: a malformed record makes the job wait until an operator repairs it; nothing is spent against it.
  expect(after).toMatch(/^refused/);
});
