/**
 * Phaseline as another Firebase project gets it: `npm pack` of functions/ (the package
 * `phaseline`), installed into a project outside this repository (test/e2e/outside-project: its
 * own package.json, firebase.json and functions folder), built against the types the package
 * ships, and run under that project's own functions, tasks and auth emulators (on ports of its
 * own, beside the ones this layer runs under), sharing the Firestore emulator under another
 * project ID. A job submitted over HTTP completes through Cloud Tasks.
 *
 * The install reads the npm cache first (`--prefer-offline`), which `npm ci` has filled on CI.
 */
import { execFile, type ChildProcess } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { spawnGroup, stopGroup } from '../../scripts/lib/processes';
import { anonymousUser, functionUrl } from '../support/emulators';

const ROOT = join(__dirname, '..', '..');
const PROJECT_ID = 'demo-phaseline-outside';
const run = promisify(execFile);

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  await new Promise((resolve) => server.close(resolve));
  if (address === null || typeof address === 'string') throw new Error('no port');
  return address.port;
}

/** This process's environment without the emulators it runs under (their hub, hosts and project), Firestore's host kept. */
function environmentOutside(): NodeJS.ProcessEnv {
  const kept = Object.entries(process.env).filter(([name]) => name === 'FIRESTORE_EMULATOR_HOST' || !/EMULATOR|^GCLOUD_PROJECT$|^GOOGLE_CLOUD_PROJECT$|^FIREBASE_CONFIG$/.test(name));
  return { ...Object.fromEntries(kept), CI: 'true', METADATA_SERVER_DETECTION: 'none' };
}

const work = mkdtempSync(join(tmpdir(), 'phaseline-outside-'));
let emulators: ChildProcess | undefined;
let emulatorOutput = '';
afterAll(async () => {
  if (emulators) await stopGroup(emulators);
  rmSync(work, { recursive: true, force: true });
});

interface FirestoreDocument {
  readonly fields?: Record<string, { readonly stringValue?: string }>;
}

/** A document of the outside project, read past the rules (the emulator's `owner` token), or null. */
async function readDocument(path: string): Promise<FirestoreDocument | null> {
  const response = await fetch(`http://${process.env.FIRESTORE_EMULATOR_HOST}/v1/projects/${PROJECT_ID}/databases/(default)/documents/${path}`, { headers: { Authorization: 'Bearer owner' } });
  if (response.status === 404) return null;
  if (!response.ok) throw new Error(`reading ${path}: ${response.status} ${await response.text()}`);
  return (await response.json()) as FirestoreDocument;
}

/** Polls (wall time: the functions run in other processes) until `probe` gives a value. */
async function until<T>(what: string, timeoutMs: number, probe: () => Promise<T | null>): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== null) return value;
    if (Date.now() > deadline) throw new Error(`${what} did not happen in ${timeoutMs} ms. Emulator output:\n${emulatorOutput.slice(-4000)}`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

test('a project outside the repository installs the packed package, deploys a pipeline with createPhaseline and completes a job', async () => {
  const started = Date.now();
  const timings: string[] = [];
  const lap = (what: string) => timings.push(`${what} ${((Date.now() - started) / 1000).toFixed(1)} s`);

  // The build is the layer's own (`npm run test:e2e` and `npm test` build before the tests run).
  if (!existsSync(join(ROOT, 'functions', 'lib', 'api', 'index.d.ts'))) throw new Error('functions/lib/ is not built: run `npm run build` first');
  const packed = await run('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', work], { cwd: join(ROOT, 'functions') });
  const [{ filename }] = JSON.parse(packed.stdout) as [{ filename: string }];
  lap('packed');

  const project = join(work, 'project');
  cpSync(join(__dirname, 'outside-project'), project, { recursive: true });
  const manifest = join(project, 'functions', 'package.json');
  writeFileSync(manifest, readFileSync(manifest, 'utf8').replace('PHASELINE_TARBALL', `file:${join(work, filename)}`));
  const [functionsPort, tasksPort, authPort, hubPort, loggingPort] = await Promise.all([freePort(), freePort(), freePort(), freePort(), freePort()]);
  const at = (port: number) => ({ host: '127.0.0.1', port });
  const emulatorsConfig = { functions: at(functionsPort), tasks: at(tasksPort), auth: at(authPort), hub: at(hubPort), logging: at(loggingPort), ui: { enabled: false }, singleProjectMode: true };
  writeFileSync(join(project, 'firebase.json'), JSON.stringify({ functions: [{ source: 'functions', codebase: 'default' }], emulators: emulatorsConfig }, null, 2));

  const env = environmentOutside();
  await run('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: join(project, 'functions'), env, maxBuffer: 16 * 1024 * 1024 });
  lap('installed');
  // Built against the package's own .d.ts (package.json `exports` and `types`), not this repository's sources.
  await run(join(ROOT, 'node_modules', '.bin', 'tsc'), ['-p', join(project, 'functions', 'tsconfig.json')], { cwd: project, env });
  lap('built');

  emulators = spawnGroup(join(ROOT, 'node_modules', '.bin', 'firebase'), ['emulators:start', '--only', 'functions,tasks,auth', '--project', PROJECT_ID], { cwd: project, env, stdio: 'pipe' });
  const keep = (chunk: Buffer) => (emulatorOutput += chunk.toString());
  emulators.stdout?.on('data', keep);
  emulators.stderr?.on('data', keep);
  const outside = { id: PROJECT_ID, hub: `127.0.0.1:${hubPort}` };
  const hub = outside.hub;
  const submitUrl = await until('the hub answering', 120_000, () => functionUrl('submitJob', outside).catch(() => null));
  // Loaded once it answers as the handler does (401 without a token), not the emulator's 404 for a function it does not know yet.
  await until('submitJob loading', 120_000, async () => ((await fetch(submitUrl, { method: 'POST' }).catch(() => null))?.status === 401 ? true : null));
  lap('emulators up');

  const user = await anonymousUser(hub);
  const submitted = await fetch(submitUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${user.idToken}` },
    body: JSON.stringify({ pipeline: 'greetings', input: { names: ['Ada', 'Grace'] } }),
  });
  expect(submitted.status).toBe(202);
  const { taskId, status } = (await submitted.json()) as { taskId: string; status: string };
  expect(status).toBe('queued');

  const finished = await until('the job finishing', 120_000, async () => {
    const job = await readDocument(`jobs/${taskId}`);
    const state = job?.fields?.status?.stringValue;
    return state === 'completed' || state === 'failed' || state === 'quarantined' ? job : null;
  });
  lap('completed');
  expect(finished.fields?.status?.stringValue).toBe('completed');
  expect(finished.fields?.owner?.stringValue).toBe(user.uid);
  const result = await readDocument(`jobs/${taskId}/results/final`);
  expect(result?.fields?.markdown?.stringValue).toBe('Hello, Ada!\nHello, Grace!\n24 characters');
  // Bad input is refused by the pipeline's own schema, with a readable message, as in this repository.
  const refused = await fetch(submitUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${user.idToken}` },
    body: JSON.stringify({ pipeline: 'greetings', input: { names: [] } }),
  });
  expect(refused.status).toBe(400);
  expect(await refused.text()).toMatch(/input\.names/);
  console.log(`packed-package: ${timings.join(', ')}`);
}, 420_000);
