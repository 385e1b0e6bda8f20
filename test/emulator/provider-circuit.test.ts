/**
 * The provider circuit as one process sees it: with a read freshness window, a check inside the
 * window answers from what this process last read or wrote (no read), a circuit another worker
 * opened is seen once the window has passed, and this process's own outage is seen at once.
 */
import { DEFAULT_CIRCUIT_POLICY, type CircuitPolicy } from '../../functions/src/core/circuit';
import { firestoreCircuit } from '../../functions/src/store/provider-circuit';
import { openTestFirestore, type TestFirestore } from '../support/firestore';

let firestore: TestFirestore;
beforeAll(() => {
  firestore = openTestFirestore('provider-circuit');
});
beforeEach(() => firestore.reset());
afterAll(() => firestore.close());

const T0 = 1_000_000;
const policy: CircuitPolicy = { failureThreshold: 2, windowMs: 60_000, coolDownMs: 60_000, readFreshnessMs: 5_000 };

test('the default policy trusts a read for 5 s', () => {
  expect(DEFAULT_CIRCUIT_POLICY.readFreshnessMs).toBe(5_000);
});

test('another worker opens the circuit: seen once the freshness window has passed, not before', async () => {
  const here = firestoreCircuit(firestore.db, 'model', policy);
  const elsewhere = firestoreCircuit(firestore.db, 'model', policy);
  expect(await here.check(T0)).toMatchObject({ open: false });

  await elsewhere.recordOutage(T0 + 100, 'HTTP 503');
  await elsewhere.recordOutage(T0 + 200, 'HTTP 503');
  expect(await elsewhere.check(T0 + 300)).toMatchObject({ open: true, untilMs: T0 + 200 + 60_000 });

  // Inside the window this process answers from its own read (closed); past it, it reads again.
  expect(await here.check(T0 + 4_999)).toMatchObject({ open: false });
  expect(await here.check(T0 + 5_000)).toMatchObject({ open: true, untilMs: T0 + 200 + 60_000 });
});

test("this process's own outages and recoveries are what it answers next, without waiting for the window", async () => {
  const here = firestoreCircuit(firestore.db, 'model', policy);
  expect(await here.check(T0)).toMatchObject({ open: false });
  await here.recordOutage(T0 + 10, 'HTTP 503');
  await here.recordOutage(T0 + 20, 'HTTP 503');
  expect(await here.check(T0 + 30)).toMatchObject({ open: true });

  // After the cool-down a probe succeeds and closes it: the next check says so at once.
  await here.recordSuccess(T0 + 60_100);
  expect(await here.check(T0 + 60_110)).toMatchObject({ open: false, needsClose: false });
});

test('without a freshness window every check reads: another worker\'s outage is seen at once', async () => {
  const here = firestoreCircuit(firestore.db, 'model', { ...policy, readFreshnessMs: 0 });
  const elsewhere = firestoreCircuit(firestore.db, 'model', policy);
  expect(await here.check(T0)).toMatchObject({ open: false });
  await elsewhere.recordOutage(T0 + 1, 'HTTP 503');
  await elsewhere.recordOutage(T0 + 2, 'HTTP 503');
  expect(await here.check(T0 + 3)).toMatchObject({ open: true });
});
