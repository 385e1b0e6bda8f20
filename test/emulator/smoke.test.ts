import { FieldValue } from 'firebase-admin/firestore';
import { openTestFirestore, type TestFirestore } from '../support/firestore';

let store: TestFirestore;
beforeAll(() => {
  store = openTestFirestore('smoke');
});
beforeEach(() => store.reset());
afterAll(() => store.close());

test('a transaction conditioned on the update time it read is refused after a concurrent write', async () => {
  const ref = store.db.doc('smoke/counter');
  await ref.set({ value: 1 });
  const read = await ref.get();
  await ref.update({ value: 2 }); // a concurrent writer lands first

  await expect(ref.update({ value: 3 }, { lastUpdateTime: read.updateTime! })).rejects.toMatchObject({ code: 9 });
  expect((await ref.get()).get('value')).toBe(2);
});

test('concurrent transactional increments all land exactly once', async () => {
  const ref = store.db.doc('smoke/counter');
  await ref.set({ value: 0 });
  await Promise.all(
    Array.from({ length: 5 }, () =>
      store.db.runTransaction(async (tx) => {
        const snapshot = await tx.get(ref);
        tx.update(ref, { value: (snapshot.get('value') as number) + 1, touched: FieldValue.serverTimestamp() });
      }),
    ),
  );
  expect((await ref.get()).get('value')).toBe(5);
});

test('reset empties the project', async () => {
  await store.db.doc('smoke/a').set({ a: 1 });
  await store.reset();
  expect((await store.db.collection('smoke').get()).size).toBe(0);
});
