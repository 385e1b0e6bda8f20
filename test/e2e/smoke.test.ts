import { deleteApp, initializeApp } from 'firebase-admin/app';
import { getFirestore } from 'firebase-admin/firestore';
import { anonymousUser, E2E_PROJECT_ID, functionUrl } from '../support/emulators';

const app = initializeApp({ projectId: E2E_PROJECT_ID }, 'e2e-smoke');
const db = getFirestore(app);
afterAll(async () => {
  await db.terminate();
  await deleteApp(app);
});

async function waitFor<T>(probe: () => Promise<T | undefined>, timeoutMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error('Timed out waiting for the emulators');
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

test('submit over HTTP enqueues a task that a task-queue function receives and records', async () => {
  const { idToken, uid } = await anonymousUser();
  const response = await fetch(await functionUrl('submitJob'), {
    method: 'POST',
    headers: { authorization: `Bearer ${idToken}`, 'content-type': 'application/json' },
    body: JSON.stringify({}),
  });
  expect(response.status).toBe(202);
  const body = (await response.json()) as { taskId: string; statusPath: string };
  const job = await waitFor(async () => {
    const snapshot = await db.doc(body.statusPath).get();
    return snapshot.get('status') === 'completed' ? snapshot : undefined;
  }, 30_000);
  expect(job.get('owner')).toBe(uid);
});
