/**
 * The whole path as a user takes it: a browser-style client signs in on the Auth emulator, submits
 * over HTTP, the phases run as Cloud Tasks through the functions emulator, and the client watches
 * the job document and reads the result under the project's security rules.
 */
import { deleteApp, initializeApp, type FirebaseApp } from 'firebase/app';
import { connectAuthEmulator, getAuth, signInAnonymously, type Auth } from 'firebase/auth';
import { connectFirestoreEmulator, doc, getDoc, getFirestore, onSnapshot, terminate, type DocumentData, type Firestore } from 'firebase/firestore';
import { E2E_PROJECT_ID, emulatorAddress, functionUrl } from '../support/emulators';

interface Client {
  readonly app: FirebaseApp;
  readonly auth: Auth;
  readonly db: Firestore;
}

const clients: Client[] = [];

async function signedInClient(name: string): Promise<Client & { idToken: string; uid: string }> {
  const app = initializeApp({ projectId: E2E_PROJECT_ID, apiKey: 'demo-key', authDomain: 'localhost' }, name);
  const auth = getAuth(app);
  connectAuthEmulator(auth, `http://${await emulatorAddress('auth')}`, { disableWarnings: true });
  const db = getFirestore(app);
  const [host, port] = (process.env.FIRESTORE_EMULATOR_HOST ?? '').split(':');
  connectFirestoreEmulator(db, host ?? '127.0.0.1', Number(port));
  const credential = await signInAnonymously(auth);
  const client = { app, auth, db };
  clients.push(client);
  return { ...client, idToken: await credential.user.getIdToken(), uid: credential.user.uid };
}

afterAll(async () => {
  for (const client of clients) {
    await terminate(client.db);
    await deleteApp(client.app);
  }
});

function watchUntil(db: Firestore, path: string, done: (data: DocumentData) => boolean, timeoutMs: number): Promise<{ data: DocumentData; statuses: string[] }> {
  return new Promise((resolve, reject) => {
    const statuses: string[] = [];
    const timer = setTimeout(() => {
      unsubscribe();
      reject(new Error(`${path} did not finish in ${timeoutMs} ms; statuses seen: ${statuses.join(' → ')}`));
    }, timeoutMs);
    const unsubscribe = onSnapshot(doc(db, path), (snapshot) => {
      const data = snapshot.data();
      if (!data) return;
      const status = String(data.status);
      if (statuses.at(-1) !== status) statuses.push(status);
      if (done(data)) {
        clearTimeout(timer);
        unsubscribe();
        resolve({ data, statuses });
      }
    }, reject);
  });
}

test('submit over HTTP, phases through Cloud Tasks, completion watched from Firestore under the rules', async () => {
  const user = await signedInClient('e2e-owner');
  const response = await fetch(await functionUrl('submitJob'), {
    method: 'POST',
    headers: { authorization: `Bearer ${user.idToken}`, 'content-type': 'application/json', 'idempotency-key': `e2e-${Date.now()}` },
    body: JSON.stringify({ pipeline: 'canary', input: { text: 'One paragraph here.\n\nAnd a second, longer paragraph of text.' } }),
  });
  expect(response.status).toBe(202);
  const accepted = (await response.json()) as { taskId: string; status: string; statusPath: string };
  expect(accepted).toEqual({ taskId: accepted.taskId, status: 'queued', statusPath: `jobs/${accepted.taskId}` });

  const { data, statuses } = await watchUntil(user.db, accepted.statusPath, (job) => ['completed', 'failed', 'quarantined'].includes(String(job.status)), 90_000);
  expect(data.status).toBe('completed');
  expect(data.outcome).toBe('complete');
  expect(data.owner).toBe(user.uid);
  expect(statuses.at(-1)).toBe('completed');

  const result = await getDoc(doc(user.db, `${accepted.statusPath}/results/final`));
  expect(result.get('markdown')).toContain('2 paragraphs, 10 words.');

  // Someone else can neither read the job nor its result.
  const stranger = await signedInClient('e2e-stranger');
  await expect(getDoc(doc(stranger.db, accepted.statusPath))).rejects.toMatchObject({ code: 'permission-denied' });
  await expect(getDoc(doc(stranger.db, `${accepted.statusPath}/results/final`))).rejects.toMatchObject({ code: 'permission-denied' });
});
