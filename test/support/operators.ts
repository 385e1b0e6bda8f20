/**
 * Operators for the e2e tests: users of the Auth emulator given the `admin` custom claim through
 * the admin SDK (`setCustomUserClaims`, what `phaseline admin grant` does), and their ID tokens.
 */
import type { App } from 'firebase-admin/app';
import { getAuth } from 'firebase-admin/auth';
import type { LocalTarget } from '../../scripts/cli/target';
import { emulatorAddress } from './emulators';

/** Points this process's admin SDK at the Auth emulator the e2e layer runs under. */
export async function useAuthEmulator(): Promise<string> {
  const host = await emulatorAddress('auth');
  process.env.FIREBASE_AUTH_EMULATOR_HOST ??= host;
  return host;
}

/** Sets (or replaces) a user's custom claims, creating the user when it does not exist yet. */
export async function setClaims(admin: App, uid: string, claims: Record<string, unknown>): Promise<void> {
  const auth = getAuth(admin);
  await auth.getUser(uid).catch(() => auth.createUser({ uid }));
  await auth.setCustomUserClaims(uid, claims);
}

/** An ID token for `uid` carrying its current claims: a custom token (unsigned; the emulator accepts it) exchanged at the Auth emulator. */
export async function idTokenFor(admin: App, uid: string): Promise<string> {
  const customToken = await getAuth(admin).createCustomToken(uid);
  const response = await fetch(`http://${await useAuthEmulator()}/identitytoolkit.googleapis.com/v1/accounts:signInWithCustomToken?key=demo-key`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ token: customToken, returnSecureToken: true }),
  });
  if (!response.ok) throw new Error(`Custom-token sign-in failed: ${response.status} ${await response.text()}`);
  return ((await response.json()) as { idToken: string }).idToken;
}

/**
 * The command line's target for the emulator test layer: Firestore is the test run's emulator, and
 * nothing listens on port 1, so a command that reaches for the Auth or Tasks emulator fails loudly.
 */
export function localCliTarget(projectId: string, functionsUrl = 'http://127.0.0.1:1'): LocalTarget {
  const host = process.env.FIRESTORE_EMULATOR_HOST;
  if (!host) throw new Error('FIRESTORE_EMULATOR_HOST is not set: the emulator layer runs under the Firestore emulator');
  return {
    kind: 'local',
    projectId,
    region: 'us-central1',
    hosts: { firestore: host, functions: '127.0.0.1:1', auth: '127.0.0.1:1', tasks: '127.0.0.1:1' },
    firestoreUrl: `http://${host}/v1`,
    functionsUrl,
  };
}
