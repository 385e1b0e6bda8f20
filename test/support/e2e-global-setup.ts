/** The e2e layer needs firebase-tools' emulators around it; refuse to run (not skip) without them. */
export default function setup(): void {
  if (!process.env.FIREBASE_EMULATOR_HUB || !process.env.FIRESTORE_EMULATOR_HOST) {
    throw new Error(
      'The e2e tests run under the Firebase emulators: use `npm run test:e2e` (or `npm test`), ' +
        'which starts Firestore and `firebase emulators:exec --only functions,tasks,auth`.',
    );
  }
}
