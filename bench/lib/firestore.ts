/** The official Firestore emulator for the bench, through the project's launcher, and clients on it. */
import { deleteApp, initializeApp, type App } from 'firebase-admin/app';
import { getFirestore, type Firestore } from 'firebase-admin/firestore';
import { resetFirestore, startFirestoreEmulator, type RunningFirestoreEmulator } from '../../scripts/lib/firestore-emulator';
import { FirestoreCounter } from './counting';

export interface BenchFirestore {
  readonly host: string;
  readonly emulator: RunningFirestoreEmulator;
  stop(): Promise<void>;
}

/** Starts the emulator (or reuses FIRESTORE_EMULATOR_HOST) and points the admin SDK at it. */
export async function startBenchFirestore(): Promise<BenchFirestore> {
  const emulator = await startFirestoreEmulator();
  process.env.FIRESTORE_EMULATOR_HOST = emulator.host;
  return {
    host: emulator.host,
    emulator,
    stop: async () => {
      await emulator.stop();
      if (emulator.startedHere) delete process.env.FIRESTORE_EMULATOR_HOST;
    },
  };
}

export interface ProjectClients {
  readonly projectId: string;
  /** The client the implementation under test uses; everything it does is counted. */
  readonly db: Firestore;
  readonly counter: FirestoreCounter;
  /** A second client for the bench's own bookkeeping (status checks, seeding): never counted. */
  readonly inspector: Firestore;
  reset(): Promise<void>;
  close(): Promise<void>;
}

let appSequence = 0;

function openApp(projectId: string): { app: App; db: Firestore } {
  appSequence += 1;
  const app = initializeApp({ projectId }, `bench-${projectId}-${appSequence}-${process.pid}`);
  return { app, db: getFirestore(app) };
}

/** Two clients on one emulator project of the bench's own (so scenarios never see each other's data). */
export function openProject(projectId: string): ProjectClients {
  const host = process.env.FIRESTORE_EMULATOR_HOST;
  if (!host) throw new Error('FIRESTORE_EMULATOR_HOST is not set: start the emulator with startBenchFirestore() first.');
  const counted = openApp(projectId);
  const inspector = openApp(projectId);
  const counter = new FirestoreCounter(counted.db);
  return {
    projectId,
    db: counted.db,
    counter,
    inspector: inspector.db,
    reset: () => resetFirestore(host, projectId),
    close: async () => {
      await counted.db.terminate();
      await inspector.db.terminate();
      await deleteApp(counted.app);
      await deleteApp(inspector.app);
    },
  };
}
