/**
 * Finds, starts and stops the official Cloud Firestore emulator for tests and local scripts.
 *
 * Search order: an already running emulator named by FIRESTORE_EMULATOR_HOST, an explicit jar
 * (PHASELINE_FIRESTORE_EMULATOR_JAR), the Google Cloud CLI component, firebase-tools' download
 * cache. npm reimplementations of Firestore are deliberately not considered: they do not honour
 * transactions or update-time preconditions, which is what this project is about.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, realpathSync } from 'node:fs';
import { createServer } from 'node:net';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';

const GCLOUD_COMPONENT_JAR = 'platform/cloud-firestore-emulator/cloud-firestore-emulator.jar';
const EMULATOR_MAIN_CLASS = 'com.google.cloud.datastore.emulator.firestore.CloudFirestore';
const READY_TIMEOUT_MS = 60_000;
const STOP_GRACE_MS = 5_000;

export const INSTALL_HELP = [
  'No Cloud Firestore emulator was found. Install one of:',
  '  - the Google Cloud CLI component: `gcloud components install cloud-firestore-emulator`',
  '    (or the Debian/Ubuntu package `google-cloud-cli-firestore-emulator`), with Java 17 or newer;',
  '  - firebase-tools\' copy: `npx firebase setup:emulators:firestore` (needs Java 21 and a download);',
  'or point PHASELINE_FIRESTORE_EMULATOR_JAR at cloud-firestore-emulator.jar,',
  'or start an emulator yourself and set FIRESTORE_EMULATOR_HOST=127.0.0.1:PORT.',
].join('\n');

export class FirestoreEmulatorNotFoundError extends Error {
  constructor(tried: readonly string[]) {
    super(`${INSTALL_HELP}\nLooked in:\n${tried.map((place) => `  - ${place}`).join('\n')}`);
    this.name = 'FirestoreEmulatorNotFoundError';
  }
}

export interface RunningFirestoreEmulator {
  /** host:port, the value FIRESTORE_EMULATOR_HOST takes. */
  readonly host: string;
  /** False when an emulator that was already running is reused; stop() then leaves it alone. */
  readonly startedHere: boolean;
  stop(): Promise<void>;
}

export interface StartOptions {
  /** Port to bind; 0 (the default) picks a free loopback port. */
  readonly port?: number;
  /** Where the emulator's own log goes; 'ignore' by default. */
  readonly logTo?: 'inherit' | 'ignore';
  /** Environment to read FIRESTORE_EMULATOR_HOST and the jar override from. */
  readonly env?: NodeJS.ProcessEnv;
}

interface EmulatorCommand {
  readonly jar: string;
  readonly args: (port: number) => string[];
}

function gcloudComponentJars(env: NodeJS.ProcessEnv): string[] {
  const candidates = ['/usr/lib/google-cloud-sdk', '/usr/share/google-cloud-sdk', '/opt/google-cloud-sdk'];
  if (env.CLOUDSDK_ROOT_DIR) candidates.unshift(env.CLOUDSDK_ROOT_DIR);
  for (const dir of (env.PATH ?? '').split(':')) {
    const gcloud = join(dir, 'gcloud');
    if (dir && existsSync(gcloud)) candidates.push(dirname(dirname(realpathSync(gcloud))));
  }
  return [...new Set(candidates.map((root) => join(root, GCLOUD_COMPONENT_JAR)))];
}

function firebaseCacheJars(): string[] {
  const cacheDir = join(homedir(), '.cache', 'firebase', 'emulators');
  if (!existsSync(cacheDir)) return [join(cacheDir, 'cloud-firestore-emulator-v*.jar')];
  return readdirSync(cacheDir)
    .filter((name) => /^cloud-firestore-emulator-v[\d.]+\.jar$/.test(name))
    .sort()
    .reverse()
    .map((name) => join(cacheDir, name));
}

/** Resolves the emulator to run, or throws with the install instructions. */
export function findFirestoreEmulator(env: NodeJS.ProcessEnv = process.env): EmulatorCommand {
  const tried: string[] = [];
  const byMainClass = (jar: string): EmulatorCommand => ({
    jar,
    args: (port) => ['-Duser.language=en', '-cp', jar, EMULATOR_MAIN_CLASS, 'start', '--host=127.0.0.1', `--port=${port}`],
  });
  const explicit = env.PHASELINE_FIRESTORE_EMULATOR_JAR;
  if (explicit) {
    if (existsSync(explicit)) return byMainClass(explicit);
    tried.push(`${explicit} (PHASELINE_FIRESTORE_EMULATOR_JAR: no such file)`);
  } else {
    for (const jar of gcloudComponentJars(env)) {
      if (existsSync(jar)) return byMainClass(jar);
      tried.push(jar);
    }
    for (const jar of firebaseCacheJars()) {
      // firebase-tools' jar carries its own Main-Class.
      if (existsSync(jar)) return { jar, args: (port) => ['-Duser.language=en', '-jar', jar, '--host=127.0.0.1', `--port=${port}`] };
      tried.push(jar);
    }
  }
  throw new FirestoreEmulatorNotFoundError(tried);
}

function assertJavaAvailable(): void {
  const probe = spawnSync('java', ['-version'], { stdio: 'ignore' });
  if (probe.error || probe.status !== 0) {
    throw new FirestoreEmulatorNotFoundError(['java: not found on PATH (the emulator needs Java 17 or newer)']);
  }
}

export async function freeLoopbackPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

async function answers(host: string): Promise<boolean> {
  try {
    const response = await fetch(`http://${host}/`, { signal: AbortSignal.timeout(1_000) });
    return response.ok;
  } catch {
    return false;
  }
}

function killGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // Already gone.
  }
}

export async function startFirestoreEmulator(options: StartOptions = {}): Promise<RunningFirestoreEmulator> {
  const env = options.env ?? process.env;
  const existing = env.FIRESTORE_EMULATOR_HOST;
  if (existing) {
    if (!(await answers(existing))) {
      throw new Error(`FIRESTORE_EMULATOR_HOST=${existing} is set but nothing answers there.`);
    }
    return { host: existing, startedHere: false, stop: async () => {} };
  }

  const command = findFirestoreEmulator(env);
  assertJavaAvailable();
  const port = options.port ?? (await freeLoopbackPort());
  const host = `127.0.0.1:${port}`;
  // Detached: the emulator gets its own process group, so stopping it takes every child with it.
  const child = spawn('java', command.args(port), { detached: true, stdio: ['ignore', options.logTo ?? 'ignore', options.logTo ?? 'ignore'] });
  const killOnExit = (): void => killGroup(child, 'SIGKILL');
  process.once('exit', killOnExit);

  let exited: string | undefined;
  child.once('exit', (code, signal) => {
    exited = `exited with ${signal ?? code}`;
  });
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (!(await answers(host))) {
    if (exited !== undefined || Date.now() > deadline) {
      killGroup(child, 'SIGKILL');
      throw new Error(`The Firestore emulator (${command.jar}) did not answer on ${host}: ${exited ?? 'timed out'}.`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }

  return {
    host,
    startedHere: true,
    stop: async () => {
      process.removeListener('exit', killOnExit);
      if (exited !== undefined) return;
      const gone = new Promise<void>((resolve) => child.once('exit', () => resolve()));
      killGroup(child, 'SIGTERM');
      const timer = setTimeout(() => killGroup(child, 'SIGKILL'), STOP_GRACE_MS);
      await gone;
      clearTimeout(timer);
    },
  };
}

/** Deletes every document of one project's default database. */
export async function resetFirestore(host: string, projectId: string): Promise<void> {
  const response = await fetch(`http://${host}/emulator/v1/projects/${projectId}/databases/(default)/documents`, { method: 'DELETE' });
  if (!response.ok) throw new Error(`Firestore emulator reset failed: ${response.status} ${await response.text()}`);
}

/** Loads security rules into the emulator for one project; they then apply to non-admin clients. */
export async function loadSecurityRules(host: string, projectId: string, rulesPath: string): Promise<void> {
  const content = readFileSync(rulesPath, 'utf8');
  const response = await fetch(`http://${host}/emulator/v1/projects/${projectId}:securityRules`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ rules: { files: [{ name: 'firestore.rules', content }] } }),
  });
  if (!response.ok) throw new Error(`Loading security rules failed: ${response.status} ${await response.text()}`);
}
