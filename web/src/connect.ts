/**
 * What both pages (the chat page and the operator console) start with: the emulators' addresses
 * from /config.json, the Auth and Firestore emulators connected, and the user signed in (the
 * remembered one, or a new anonymous account).
 */
import { initializeApp } from 'firebase/app';
import { connectAuthEmulator, getAuth, signInAnonymously, type User } from 'firebase/auth';
import { connectFirestoreEmulator, getFirestore, type Firestore } from 'firebase/firestore';
import { loadConfig, type PageConfig } from './config';

export interface Connected {
  readonly config: PageConfig;
  readonly db: Firestore;
  readonly user: User;
}

export async function connectAndSignIn(): Promise<Connected> {
  const config = await loadConfig();
  const app = initializeApp({ apiKey: config.apiKey, projectId: config.projectId, authDomain: '127.0.0.1' });
  const auth = getAuth(app);
  connectAuthEmulator(auth, config.authEmulatorUrl, { disableWarnings: true });
  const db = getFirestore(app);
  connectFirestoreEmulator(db, config.firestoreHost, config.firestorePort);
  await auth.authStateReady();
  const user = auth.currentUser ?? (await signInAnonymously(auth)).user;
  return { config, db, user };
}
