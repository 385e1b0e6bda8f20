import { deleteApp, initializeApp, type App } from 'firebase-admin/app';
import { getFirestore, type Firestore } from 'firebase-admin/firestore';
import { resetFirestore } from '../../scripts/lib/firestore-emulator';

export interface TestFirestore {
  readonly db: Firestore;
  readonly projectId: string;
  reset(): Promise<void>;
  close(): Promise<void>;
}

function emulatorHost(): string {
  const host = process.env.FIRESTORE_EMULATOR_HOST;
  if (!host) throw new Error('FIRESTORE_EMULATOR_HOST is not set: the emulator layer starts it in its global setup.');
  return host;
}

/**
 * A Firestore client on the emulator in a project of this test file's own, so test files running
 * in parallel never see (or reset) each other's documents.
 */
export function openTestFirestore(label: string): TestFirestore {
  const host = emulatorHost();
  const projectId = `demo-${label}-${process.env.JEST_WORKER_ID ?? '0'}`.toLowerCase().replace(/[^a-z0-9-]/g, '-');
  const app: App = initializeApp({ projectId }, `${projectId}-${Math.random().toString(36).slice(2)}`);
  const db = getFirestore(app);
  return {
    db,
    projectId,
    reset: () => resetFirestore(host, projectId),
    close: async () => {
      await db.terminate();
      await deleteApp(app);
    },
  };
}
