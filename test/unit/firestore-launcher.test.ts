import { findFirestoreEmulator, FirestoreEmulatorNotFoundError, startFirestoreEmulator } from '../../scripts/lib/firestore-emulator';

test('an unfindable emulator fails with the install instructions, naming where it looked', () => {
  const lookup = () => findFirestoreEmulator({ PHASELINE_FIRESTORE_EMULATOR_JAR: '/nowhere/cloud-firestore-emulator.jar', PATH: '' });
  expect(lookup).toThrow(FirestoreEmulatorNotFoundError);
  expect(lookup).toThrow(/gcloud components install cloud-firestore-emulator/);
  expect(lookup).toThrow(/\/nowhere\/cloud-firestore-emulator.jar/);
});

test('the Google Cloud CLI component is found through gcloud on PATH', () => {
  const found = findFirestoreEmulator({ PATH: '/usr/bin' });
  expect(found.jar).toMatch(/cloud-firestore-emulator\.jar$/);
  expect(found.args(8123)).toEqual(expect.arrayContaining(['start', '--host=127.0.0.1', '--port=8123']));
});

test('a FIRESTORE_EMULATOR_HOST that does not answer is an error, not a silent fallback', async () => {
  await expect(startFirestoreEmulator({ env: { FIRESTORE_EMULATOR_HOST: '127.0.0.1:9' } })).rejects.toThrow(/nothing answers/);
});
