import { startFirestoreEmulator, type RunningFirestoreEmulator } from '../../scripts/lib/firestore-emulator';

declare global {
  var phaselineFirestoreEmulator: RunningFirestoreEmulator | undefined;
}

/** Starts the official emulator once for the run (or reuses FIRESTORE_EMULATOR_HOST). */
export default async function setup(): Promise<void> {
  const emulator = await startFirestoreEmulator();
  globalThis.phaselineFirestoreEmulator = emulator;
  // Jest workers are forked after global setup, so they inherit this.
  process.env.FIRESTORE_EMULATOR_HOST = emulator.host;
  // Only emulators here: no client library should probe the cloud metadata server.
  process.env.METADATA_SERVER_DETECTION = 'none';
}
