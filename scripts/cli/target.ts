/**
 * Where the CLI acts: the local stack (the emulators on firebase.json's ports) or a deployed
 * project. Every environment variable the CLI reads is named here.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { CliError, UsageError } from './errors';

export const ENV = {
  project: 'PHASELINE_PROJECT',
  region: 'PHASELINE_REGION',
  /** A Firebase ID token of the user, for a deployed project (optional locally). */
  idToken: 'PHASELINE_ID_TOKEN',
  /** Base URL of the HTTP functions, when they are not where the target says. */
  functionsUrl: 'PHASELINE_FUNCTIONS_URL',
  /** Where the local user's identity file lives (default ~/.phaseline). */
  home: 'PHASELINE_HOME',
  firestoreEmulator: 'FIRESTORE_EMULATOR_HOST',
  authEmulator: 'FIREBASE_AUTH_EMULATOR_HOST',
  tasksEmulator: 'CLOUD_TASKS_EMULATOR_HOST',
  /** google-auth-library's switch for probing the GCE metadata server. */
  metadataServerDetection: 'METADATA_SERVER_DETECTION',
} as const;

export const DEMO_PROJECT_ID = 'demo-phaseline';
export const DEFAULT_REGION = 'us-central1';
export const REPO_ROOT = join(__dirname, '..', '..');

export interface EmulatorHosts {
  readonly firestore: string;
  readonly functions: string;
  readonly auth: string;
  readonly tasks: string;
}

export interface LocalTarget {
  readonly kind: 'local';
  readonly projectId: string;
  readonly region: string;
  readonly hosts: EmulatorHosts;
  /** Base of the Firestore REST API: `${firestoreUrl}/projects/...`. */
  readonly firestoreUrl: string;
  /** Base of the HTTP functions: `${functionsUrl}/submitJob`. */
  readonly functionsUrl: string;
}

export interface DeployedTarget {
  readonly kind: 'deployed';
  readonly projectId: string;
  readonly region: string;
  readonly firestoreUrl: string;
  readonly functionsUrl: string;
}

export type Target = LocalTarget | DeployedTarget;

export interface TargetOptions {
  readonly project?: string;
  readonly region?: string;
}

const PROJECT_ID = /^[a-z][a-z0-9-]{4,28}[a-z0-9]$/;
const REGION = /^[a-z]+-[a-z]+\d+$/;

/** The emulator addresses firebase.json names; firebase-tools' defaults for any it leaves out. */
export function emulatorHostsFrom(firebaseJson: unknown): EmulatorHosts {
  const emulators = (firebaseJson as { emulators?: Record<string, { host?: unknown; port?: unknown } | undefined> } | null)?.emulators ?? {};
  const host = (name: string, defaultPort: number): string => {
    const entry = emulators[name];
    const address = typeof entry?.host === 'string' ? entry.host : '127.0.0.1';
    const port = typeof entry?.port === 'number' ? entry.port : defaultPort;
    return `${address}:${port}`;
  };
  return { firestore: host('firestore', 8080), functions: host('functions', 5001), auth: host('auth', 9099), tasks: host('tasks', 9499) };
}

export function readEmulatorHosts(path = join(REPO_ROOT, 'firebase.json')): EmulatorHosts {
  let parsed: unknown = null;
  try {
    parsed = JSON.parse(readFileSync(path, 'utf8'));
  } catch {
    // No readable firebase.json: firebase-tools' default ports.
  }
  return emulatorHostsFrom(parsed);
}

/**
 * A `demo-` project exists only in the emulators (the Firebase convention), so it is the local
 * stack; any other project ID is a deployed project.
 */
export function resolveTarget(options: TargetOptions, env: NodeJS.ProcessEnv, defaults: EmulatorHosts = readEmulatorHosts()): Target {
  const projectId = options.project ?? nonEmpty(env[ENV.project]) ?? DEMO_PROJECT_ID;
  if (!PROJECT_ID.test(projectId)) throw new UsageError(`"${projectId}" is not a Firebase project ID (6 to 30 lowercase letters, digits or hyphens)`);
  const region = options.region ?? nonEmpty(env[ENV.region]) ?? DEFAULT_REGION;
  if (!REGION.test(region)) throw new UsageError(`"${region}" is not a Cloud Functions region (like us-central1 or europe-west1)`);
  const functionsOverride = nonEmpty(env[ENV.functionsUrl])?.replace(/\/+$/, '');

  if (projectId.startsWith('demo-')) {
    const hosts: EmulatorHosts = {
      firestore: nonEmpty(env[ENV.firestoreEmulator]) ?? defaults.firestore,
      auth: nonEmpty(env[ENV.authEmulator]) ?? defaults.auth,
      tasks: nonEmpty(env[ENV.tasksEmulator]) ?? defaults.tasks,
      functions: defaults.functions,
    };
    return {
      kind: 'local',
      projectId,
      region,
      hosts,
      firestoreUrl: `http://${hosts.firestore}/v1`,
      functionsUrl: functionsOverride ?? `http://${hosts.functions}/${projectId}/${region}`,
    };
  }

  const emulatorVariables = [ENV.firestoreEmulator, ENV.authEmulator, ENV.tasksEmulator].filter((name) => nonEmpty(env[name]) !== undefined);
  if (emulatorVariables.length > 0) {
    throw new CliError(
      `${new Intl.ListFormat('en', { type: 'conjunction' }).format(emulatorVariables)} ${emulatorVariables.length === 1 ? 'is' : 'are'} set, but ${projectId} is a deployed project: ` +
        'unset them to act on it, or use a demo- project for the emulators',
    );
  }
  return {
    kind: 'deployed',
    projectId,
    region,
    firestoreUrl: 'https://firestore.googleapis.com/v1',
    functionsUrl: functionsOverride ?? `https://${region}-${projectId}.cloudfunctions.net`,
  };
}

export function describeTarget(target: Target): string {
  return target.kind === 'local'
    ? `the local stack (project ${target.projectId}; Firestore ${target.hosts.firestore}, functions ${target.functionsUrl}, Auth ${target.hosts.auth})`
    : `project ${target.projectId} (${target.region})`;
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value.trim() === '' ? undefined : value.trim();
}
