/**
 * firebase-tools' functions, tasks and auth emulators for the throughput scenario, started the
 * way scripts/lib/stack.ts starts them (`firebase emulators:exec --only functions,tasks,auth`,
 * Firestore from the project's launcher through FIRESTORE_EMULATOR_HOST) but from a private
 * directory: its own firebase.json on free ports and its own build of the functions. Other runs
 * on the machine (`npm test` rebuilds functions/lib and holds the fixed ports) then neither
 * collide with the bench nor change the code under it mid-run.
 */
import { spawn } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freeLoopbackPort } from '../../scripts/lib/firestore-emulator';
import { exitCodeOf, spawnGroup, stopGroup } from '../../scripts/lib/processes';
import { DEMO_PROJECT_ID, REPO_ROOT } from '../../scripts/lib/stack';

const FIREBASE_BIN = join(REPO_ROOT, 'node_modules', '.bin', 'firebase');
const TSC_BIN = join(REPO_ROOT, 'node_modules', '.bin', 'tsc');

function run(command: string, args: readonly string[]): Promise<{ code: number; output: string }> {
  return new Promise((resolve) => {
    const child = spawn(command, args, { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.once('exit', (code) => resolve({ code: code ?? 1, output }));
  });
}

export interface IsolatedStackOptions {
  /** Extra environment for the emulators and the functions they run. */
  readonly env?: NodeJS.ProcessEnv;
  readonly log?: (line: string) => void;
  /** Where firebase-tools' own output goes. */
  readonly stdio?: 'inherit' | 'ignore';
}

/** Builds the functions privately and runs `command` under the emulators; resolves with its exit code. */
export async function runUnderIsolatedEmulators(command: string, options: IsolatedStackOptions = {}): Promise<number> {
  const firestoreHost = process.env.FIRESTORE_EMULATOR_HOST;
  if (!firestoreHost) throw new Error('FIRESTORE_EMULATOR_HOST is not set: start the Firestore emulator first.');
  const dir = mkdtempSync(join(tmpdir(), 'phaseline-bench-stack-'));
  try {
    mkdirSync(join(dir, 'functions'));
    cpSync(join(REPO_ROOT, 'functions', 'package.json'), join(dir, 'functions', 'package.json'));
    symlinkSync(join(REPO_ROOT, 'functions', 'node_modules'), join(dir, 'functions', 'node_modules'));
    symlinkSync(join(REPO_ROOT, 'node_modules'), join(dir, 'node_modules'));
    // The functions' string params, answered up front so firebase-tools does not prompt for them.
    // The throughput scenario's one anonymous user keeps many jobs in flight: per-user quotas would refuse them.
    writeFileSync(
      join(dir, 'functions', '.env'),
      'PHASELINE_PROVIDER=offline\nPHASELINE_MODEL_BASE_URL=https://api.openai.com/v1\nPHASELINE_MODEL=gpt-4o-mini\n' +
        'PHASELINE_QUOTA_ANONYMOUS_JOBS_IN_FLIGHT=100\nPHASELINE_QUOTA_ANONYMOUS_SUBMITS_PER_MINUTE=600\nPHASELINE_QUOTA_ANONYMOUS_SPEND_USD_PER_DAY=1000\n',
    );
    const build = await run(TSC_BIN, ['-p', join(REPO_ROOT, 'functions', 'tsconfig.json'), '--outDir', join(dir, 'functions', 'lib')]);
    if (build.code !== 0) throw new Error(`Building the functions failed:\n${build.output.slice(0, 4_000)}`);

    const [functions, tasks, auth, hub, logging, eventarc] = await Promise.all(Array.from({ length: 6 }, () => freeLoopbackPort()));
    const host = '127.0.0.1';
    writeFileSync(
      join(dir, 'firebase.json'),
      JSON.stringify(
        {
          functions: [{ source: 'functions', codebase: 'default', runtime: 'nodejs22' }],
          emulators: {
            functions: { host, port: functions },
            tasks: { host, port: tasks },
            auth: { host, port: auth },
            hub: { host, port: hub },
            logging: { host, port: logging },
            eventarc: { host, port: eventarc },
            ui: { enabled: false },
            singleProjectMode: true,
          },
        },
        null,
        2,
      ),
    );
    options.log?.(`  emulators from ${dir}: functions ${functions}, tasks ${tasks}, auth ${auth}, hub ${hub}`);
    // firebase-tools gives a new function worker 30 s to start; at 16 tasks in flight on a loaded 2-core machine some cold
    // starts took longer and the run failed with "Failed to load function": that measures the emulator, not Phaseline.
    const env = {
      ...process.env,
      FUNCTIONS_DISCOVERY_TIMEOUT: process.env.FUNCTIONS_DISCOVERY_TIMEOUT ?? '120',
      ...options.env,
      CI: 'true',
      FIRESTORE_EMULATOR_HOST: firestoreHost,
      GCLOUD_PROJECT: DEMO_PROJECT_ID,
    };
    const child = spawnGroup(FIREBASE_BIN, ['emulators:exec', '--only', 'functions,tasks,auth', '--project', DEMO_PROJECT_ID, command], {
      cwd: dir,
      env,
      stdio: options.stdio ?? 'ignore',
    });
    const onSignal = (): void => {
      void stopGroup(child).then(() => process.exit(130));
    };
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
    try {
      return await exitCodeOf(child);
    } finally {
      process.removeListener('SIGINT', onSignal);
      process.removeListener('SIGTERM', onSignal);
      await stopGroup(child);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
