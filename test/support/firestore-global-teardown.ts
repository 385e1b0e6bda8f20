export default async function teardown(): Promise<void> {
  const emulator = globalThis.phaselineFirestoreEmulator;
  if (emulator?.startedHere) {
    await emulator.stop();
    delete process.env.FIRESTORE_EMULATOR_HOST;
  }
}
