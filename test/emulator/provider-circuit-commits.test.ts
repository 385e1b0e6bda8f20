/**
 * The provider circuit's writes are conditioned commits (issue 28, item 2): a worker that dies
 * between reading the circuit and committing holds nobody up, and two workers recording outages at
 * the same moment both count (the later commit meets the earlier one and decides again).
 */
import type { CircuitPolicy } from '../../functions/src/core/circuit';
import { circuitPath } from '../../functions/src/store/paths';
import { firestoreCircuit } from '../../functions/src/store/provider-circuit';
import { openTestFirestore, type TestFirestore } from '../support/firestore';
import { gate } from '../support/engine';
import { afterFirstGet } from '../support/interpose';

let firestore: TestFirestore;
beforeAll(() => {
  firestore = openTestFirestore('provider-circuit-commits');
});
beforeEach(() => firestore.reset());
afterEach(() => jest.restoreAllMocks());
afterAll(() => firestore.close());

const T0 = 1_000_000;
// No read freshness: every check reads the document.
const policy: CircuitPolicy = { failureThreshold: 2, windowMs: 60_000, coolDownMs: 60_000, readFreshnessMs: 0 };

test('two workers recording an outage at once both count: the second commit meets the first and decides again, and the third failure opens the circuit', async () => {
  // Three failures open it: a lost update would leave two, and the circuit closed.
  const threeFailures: CircuitPolicy = { ...policy, failureThreshold: 3 };
  const here = firestoreCircuit(firestore.db, 'model', threeFailures);
  const elsewhere = firestoreCircuit(firestore.db, 'model', threeFailures);
  await here.recordOutage(T0, 'HTTP 503');
  // Between this worker's read and its commit, another worker records its own outage.
  const interposed = afterFirstGet(firestore.db, circuitPath('model'), () => elsewhere.recordOutage(T0 + 100, 'HTTP 503 elsewhere'));
  await here.recordOutage(T0 + 200, 'HTTP 503 here');
  expect(interposed.ran()).toBe(true);
  const stored = (await firestore.db.doc(circuitPath('model')).get()).data();
  expect(stored).toMatchObject({ state: 'open', opens: 1 });
  expect(await firestoreCircuit(firestore.db, 'model', threeFailures).check(T0 + 300)).toMatchObject({ open: true });
});

test('a worker that dies between its read and its commit holds nothing: another records an outage and the recovery at once', async () => {
  const dying = firestoreCircuit(firestore.db, 'model', policy);
  const live = firestoreCircuit(firestore.db, 'model', policy);
  await live.recordOutage(T0, 'HTTP 503');
  const hasRead = gate();
  // The dying worker's read comes back and it never goes on to commit.
  afterFirstGet(firestore.db, circuitPath('model'), () => {
    hasRead.open();
    return new Promise<never>(() => undefined);
  });
  void dying.recordOutage(T0 + 100, 'HTTP 503 then frozen');
  await hasRead.promise;
  jest.restoreAllMocks();
  expect(await live.recordOutage(T0 + 200, 'HTTP 503 again')).toMatchObject({ open: true });
  await live.recordSuccess(T0 + 300);
  expect(await live.check(T0 + 400)).toMatchObject({ open: false });
  expect((await firestore.db.doc(circuitPath('model')).get()).data()).toMatchObject({ state: 'closed', opens: 1 });
});
