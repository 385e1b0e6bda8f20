/**
 * What both pages (the chat page and the operator console) start with: the emulators' addresses
 * from /config.json, the client's Firebase connection to them, and the user signed in (the
 * remembered one, or a new anonymous account).
 */
import { initializeApp } from 'firebase/app';
import type { User } from 'firebase/auth';
import type { Firestore } from 'firebase/firestore';
import { connectFirebase, signedInUser } from '../../client';
import { loadConfig, type PageConfig } from './config';

export interface Connected {
  readonly config: PageConfig;
  readonly db: Firestore;
  readonly user: User;
}

export async function connectAndSignIn(): Promise<Connected> {
  const config = await loadConfig();
  const app = initializeApp({ apiKey: config.apiKey, projectId: config.projectId, authDomain: '127.0.0.1' });
  const { auth, db } = connectFirebase(app, { authUrl: config.authEmulatorUrl, firestoreHost: config.firestoreHost, firestorePort: config.firestorePort });
  return { config, db, user: await signedInUser(auth) };
}
