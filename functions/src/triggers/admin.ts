import { getApps, initializeApp, type App } from 'firebase-admin/app';
import { getFirestore, type Firestore } from 'firebase-admin/firestore';

/** The default admin app, created on first use (not at import, so tests can load triggers freely). */
export function adminApp(): App {
  const existing = getApps()[0];
  if (existing) return existing;
  const projectId = process.env.GCLOUD_PROJECT;
  // Under the emulator a service account ID spares the enqueue a metadata-server probe.
  const underEmulator = process.env.FUNCTIONS_EMULATOR === 'true';
  return initializeApp(underEmulator && projectId ? { serviceAccountId: `${projectId}@appspot.gserviceaccount.com` } : {});
}

export function firestore(): Firestore {
  return getFirestore(adminApp());
}
