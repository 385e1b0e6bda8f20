/**
 * Runs a command under firebase-tools' functions, tasks and auth emulators, with Firestore from the
 * project's own launcher (firebase-tools cannot start the official Firestore emulator here).
 */
import { join } from 'node:path';
import { loadSecurityRules, startFirestoreEmulator } from './firestore-emulator';
import { exitCodeOf, spawnGroup, stopGroup } from './processes';

export const REPO_ROOT = join(__dirname, '..', '..');
export const DEMO_PROJECT_ID = 'demo-phaseline';
const FIREBASE_BIN = join(REPO_ROOT, 'node_modules', '.bin', 'firebase');

export async function runUnderEmulators(script: string): Promise<number> {
  const firestore = await startFirestoreEmulator();
  // Clients (the page, the e2e tests) read under the project's real rules.
  await loadSecurityRules(firestore.host, DEMO_PROJECT_ID, join(REPO_ROOT, 'firestore.rules'));
  // METADATA_SERVER_DETECTION: under the emulators nothing should probe the cloud metadata server.
  const env = { ...process.env, CI: 'true', FIRESTORE_EMULATOR_HOST: firestore.host, GCLOUD_PROJECT: DEMO_PROJECT_ID, METADATA_SERVER_DETECTION: 'none' };
  const child = spawnGroup(
    FIREBASE_BIN,
    ['emulators:exec', '--only', 'functions,tasks,auth', '--project', DEMO_PROJECT_ID, script],
    { cwd: REPO_ROOT, env },
  );
  const stopAll = async (): Promise<void> => {
    await stopGroup(child);
    await firestore.stop();
  };
  const onSignal = (): void => {
    void stopAll().then(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    return await exitCodeOf(child);
  } finally {
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
    await stopAll();
  }
}
