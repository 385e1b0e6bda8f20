import { getApps, initializeApp, type App } from 'firebase-admin/app';
import { getAuth } from 'firebase-admin/auth';
import { getFirestore, type Firestore } from 'firebase-admin/firestore';
import { systemClock } from '../core/clock';
import { revocationCheckingVerifier, type IdTokenAuth, type VerifyCaller } from '../http/caller-identity';
import { cloudTasksQueue } from '../store/cloud-tasks-queue';
import type { TaskQueuePort } from '../store/task-queue';

/** The default admin app, created on first use (not at import, so tests can load triggers freely). */
export function adminApp(): App {
  const existing = getApps()[0];
  if (existing) return existing;
  const projectId = process.env.GCLOUD_PROJECT;
  // Under the emulator a service account ID spares the enqueue a metadata-server probe.
  const underEmulator = process.env.FUNCTIONS_EMULATOR === 'true';
  return initializeApp(underEmulator && projectId ? { serviceAccountId: `${projectId}@appspot.gserviceaccount.com` } : {});
}

/** What every trigger reads and writes through. */
export interface Backends {
  readonly firestore: Firestore;
  /** Where step and unit tasks go. */
  readonly queue: TaskQueuePort;
  /** Checks callers' ID tokens; the default app's Auth when absent. */
  readonly auth?: IdTokenAuth;
}

let backends: Backends | undefined;

/**
 * For a host that runs the exported trigger objects outside Cloud Functions (the emulator tests
 * run them through firebase-functions-test): the triggers then use this Firestore and this queue.
 * Deployed functions never call it and get the default app's. Only before the first trigger
 * call, because triggers keep what they were built with.
 */
export function provideBackends(provided: Backends): void {
  if (backends) throw new Error('The triggers are already connected to their backends: provide them before the first trigger call');
  backends = provided;
}

function connectedBackends(): Backends {
  backends ??= { firestore: getFirestore(adminApp()), queue: cloudTasksQueue(adminApp()) };
  return backends;
}

export function firestore(): Firestore {
  return connectedBackends().firestore;
}

/** Cloud Tasks (its emulator when CLOUD_TASKS_EMULATOR_HOST is set), unless a host provided another queue. */
export function stepQueue(): TaskQueuePort {
  return connectedBackends().queue;
}

let callerVerifier: VerifyCaller | undefined;

/** The one ID-token check of every HTTP trigger: revocation and disabled accounts included (http/caller-identity.ts). */
export function verifyCaller(): VerifyCaller {
  // Under the emulators FIREBASE_AUTH_EMULATOR_HOST makes the default app's Auth accept the Auth emulator's tokens.
  callerVerifier ??= revocationCheckingVerifier(connectedBackends().auth ?? getAuth(adminApp()), systemClock);
  return callerVerifier;
}
