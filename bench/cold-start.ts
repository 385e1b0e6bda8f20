/**
 * What a function instance's cold start costs before it can run a step: loading the deployed
 * functions (functions/lib/index.js, as Cloud Functions and the functions emulator load it) and the
 * first Firestore round trip (the client's gRPC and protocol buffers load then). A task redelivered
 * after a lost worker often lands on a fresh instance, so this is on the recovery path; on the local
 * stack every worker process pays it, on a machine that may be busy.
 *
 *   npm run build && npx tsx bench/cold-start.ts [--runs N] [--no-firestore]
 *
 * Each run is a fresh `node` process; the figures are its own CPU time (user + system) and wall
 * time, median and range over the runs. It also names which of the packages only some tools need
 * (the page parser, the search client, the AI SDK, the trace exporter) the load pulled in.
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { startFirestoreEmulator } from '../scripts/lib/firestore-emulator';

const REPO_ROOT = join(__dirname, '..');
const ENTRY = join(REPO_ROOT, 'functions/lib/index.js');
/** Packages a step that uses no web tool, no AI SDK model and no trace exporter does not need. */
const ON_DEMAND = ['linkedom', '@mozilla/readability', '@tavily/core', 'ai', '@opentelemetry/sdk-trace-base', '@opentelemetry/exporter-trace-otlp-http'];

interface RunFigures {
  readonly loadCpuMs: number;
  readonly loadWallMs: number;
  readonly firstReadCpuMs: number | null;
  readonly firstReadWallMs: number | null;
  readonly onDemandLoaded: readonly string[];
}

/** The child: load the functions, then (with a Firestore host) read one document, and print the figures as JSON. */
const CHILD = `
const started = process.cpuUsage(); const startedMs = Date.now();
const cpuMs = () => { const used = process.cpuUsage(started); return (used.user + used.system) / 1000; };
require(${JSON.stringify(ENTRY)});
const load = { cpu: cpuMs(), wall: Date.now() - startedMs };
const onDemand = ${JSON.stringify(ON_DEMAND)}.filter((name) => Object.keys(require.cache).some((file) => file.includes('/node_modules/' + name + '/')));
const report = (read) => { console.log(JSON.stringify({ loadCpuMs: load.cpu, loadWallMs: load.wall, firstReadCpuMs: read && read.cpu, firstReadWallMs: read && read.wall, onDemandLoaded: onDemand })); process.exit(0); };
if (!process.env.FIRESTORE_EMULATOR_HOST) report(null);
else {
  const { initializeApp } = require('firebase-admin/app');
  const { getFirestore } = require('firebase-admin/firestore');
  initializeApp({ projectId: 'demo-cold-start' });
  getFirestore().doc('jobs/cold-start').get().then(() => report({ cpu: cpuMs() - load.cpu, wall: Date.now() - startedMs - load.wall }));
}`;

function runOnce(firestoreHost: string | null): Promise<RunFigures> {
  return new Promise((resolve, reject) => {
    const env = { ...process.env, GCLOUD_PROJECT: 'demo-cold-start', ...(firestoreHost ? { FIRESTORE_EMULATOR_HOST: firestoreHost } : {}) };
    if (!firestoreHost) delete env.FIRESTORE_EMULATOR_HOST;
    const child = spawn(process.execPath, ['-e', CHILD], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (err += chunk.toString()));
    child.once('exit', (code) => {
      const line = out.trim().split('\n').at(-1) ?? '';
      if (code !== 0 || !line.startsWith('{')) reject(new Error(`the cold-start child exited with ${code}: ${err.trim() || out.trim()}`));
      else resolve(JSON.parse(line) as RunFigures);
    });
  });
}

const median = (values: readonly number[]): number => {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[middle] ?? NaN) : ((sorted[middle - 1] ?? NaN) + (sorted[middle] ?? NaN)) / 2;
};
const figure = (values: readonly number[]): string => `${Math.round(median(values))} ms (${Math.round(Math.min(...values))} to ${Math.round(Math.max(...values))})`;

async function main(): Promise<void> {
  const runsIndex = process.argv.indexOf('--runs');
  const runs = runsIndex === -1 ? 7 : Number(process.argv[runsIndex + 1]);
  if (!Number.isInteger(runs) || runs < 1) throw new Error('--runs takes a positive whole number');
  if (!existsSync(ENTRY)) throw new Error(`${ENTRY} is missing: run npm run build first (the bench loads the functions as deployed)`);
  const firestore = process.argv.includes('--no-firestore') ? null : await startFirestoreEmulator({});
  try {
    // One unmeasured run first: the files are then in the page cache, as on an instance that has started before.
    await runOnce(firestore?.host ?? null);
    const results: RunFigures[] = [];
    for (let run = 0; run < runs; run += 1) results.push(await runOnce(firestore?.host ?? null));
    console.log(`cold start of functions/lib/index.js, ${runs} fresh node processes (median, range):`);
    console.log(`  loading the functions   CPU ${figure(results.map((run) => run.loadCpuMs))}, wall ${figure(results.map((run) => run.loadWallMs))}`);
    const reads = results.filter((run) => run.firstReadCpuMs !== null && run.firstReadWallMs !== null);
    if (reads.length > 0) {
      console.log(`  first Firestore read    CPU ${figure(reads.map((run) => run.firstReadCpuMs ?? 0))}, wall ${figure(reads.map((run) => run.firstReadWallMs ?? 0))} (the emulator, this machine)`);
    }
    const loaded = [...new Set(results.flatMap((run) => run.onDemandLoaded))];
    console.log(`  on-demand packages loaded at cold start: ${loaded.length === 0 ? 'none' : loaded.join(', ')} (of ${ON_DEMAND.join(', ')})`);
  } finally {
    await firestore?.stop();
  }
}

main().catch((error: unknown) => {
  console.error(error instanceof Error ? error.message : String(error));
  process.exit(1);
});
