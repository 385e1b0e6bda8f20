/**
 * The Firebase side a frontend starts with: Auth and Firestore of an app, pointed at the
 * emulators when running locally, and a signed-in user whose ID token the HTTP calls carry.
 */
import type { FirebaseApp } from 'firebase/app';
import { connectAuthEmulator, getAuth, signInAnonymously, type Auth, type User } from 'firebase/auth';
import { connectFirestoreEmulator, getFirestore, type Firestore } from 'firebase/firestore';

/** Where the Auth and Firestore emulators listen (`npm start` prints them). */
export interface EmulatorAddresses {
  /** `http://127.0.0.1:9099`. */
  readonly authUrl: string;
  readonly firestoreHost: string;
  readonly firestorePort: number;
}

/** The app's Auth and Firestore. */
export interface FirebaseConnection {
  readonly auth: Auth;
  readonly db: Firestore;
}

/** Auth and Firestore of `app`, connected to the emulators when their addresses are given (before any other use). */
export function connectFirebase(app: FirebaseApp, emulators?: EmulatorAddresses): FirebaseConnection {
  const auth = getAuth(app);
  const db = getFirestore(app);
  if (emulators) {
    connectAuthEmulator(auth, emulators.authUrl, { disableWarnings: true });
    connectFirestoreEmulator(db, emulators.firestoreHost, emulators.firestorePort);
  }
  return { auth, db };
}

/** The user Auth remembers (once it has restored its state), or a new anonymous account. */
export async function signedInUser(auth: Auth): Promise<User> {
  await auth.authStateReady();
  return auth.currentUser ?? (await signInAnonymously(auth)).user;
}

/** An ID token source for the client's `idToken` option: the current user's token, refreshed by the SDK when it nears expiry. */
export function idTokenOf(auth: Pick<Auth, 'currentUser'>): () => Promise<string> {
  return async () => {
    const user = auth.currentUser;
    if (!user) throw new Error('Nobody is signed in: sign in before calling the functions');
    return user.getIdToken();
  };
}
