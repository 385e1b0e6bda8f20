/**
 * The local stack `npm start` and `npm run demo` run, on the ports firebase.json names:
 *
 *   - the official Firestore emulator (the project's launcher), with firestore.rules loaded;
 *   - firebase-tools' functions, tasks and auth emulators (`firebase emulators:start`), the
 *     functions built first;
 *   - the sweeper as deployed: a run every minute, sweeping again every sweepIntervalSeconds within it (see `startSweeper` for how and why in-process);
 *   - optionally the chat page from web/dist with a /config.json that points it at the emulators.
 *
 * Everything started is registered with a teardown that stops it in reverse order, process groups
 * included, whether startup finished, failed half-way or was interrupted by a signal.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, existsSync, mkdtempSync, readFileSync, statSync } from 'node:fs';
import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createNetServer } from 'node:net';
import { tmpdir } from 'node:os';
import { extname, join, normalize, relative, sep } from 'node:path';
import { createInterface } from 'node:readline';
import { deleteApp, initializeApp, type App } from 'firebase-admin/app';
import { getFirestore } from 'firebase-admin/firestore';
import { systemClock } from '../../functions/src/core/clock';
import { sweep, type RecoverySweepReport, type SweepDeps, type SweepReport } from '../../functions/src/engine/sweeper';
import { sweepMinute, type Wait } from '../../functions/src/engine/sweep-minute';
import { notifyStoppedEffects } from '../../functions/src/pipelines/notify/config';
import { stepQueueLimitsFromEnv, type StepQueueLimits } from '../../functions/src/config/environment';
import { cloudTasksQueue, STEP_FUNCTION_NAME } from '../../functions/src/store/cloud-tasks-queue';
import { runJobStep } from '../../functions/src';
import { JobStore } from '../../functions/src/store/job-store';
import { engineOptionsFromEnv } from '../../functions/src/triggers/config';
import { buildWeb, WEB_DIST } from '../../web/build';
import { loadSecurityRules, startFirestoreEmulator } from './firestore-emulator';
import { signalGroup, spawnGroup, stopGroup } from './processes';
import { DEMO_PROJECT_ID, REPO_ROOT } from './stack';

export { buildWeb, WEB_DIST };

const FIREBASE_BIN = join(REPO_ROOT, 'node_modules', '.bin', 'firebase');
export const REGION = 'us-central1';
/** The chat page's port unless PHASELINE_WEB_PORT says otherwise. */
export const DEFAULT_WEB_PORT = 5173;
export const SWEEP_EVERY_MS = 60_000;
const READY_TIMEOUT_MS = 120_000;

export type Log = (line: string) => void;

// ------------------------------------------------------------------------------------------------
// Ports and the page's configuration

export interface EmulatorPorts {
  readonly host: string;
  readonly firestore: number;
  readonly functions: number;
  readonly tasks: number;
  readonly auth: number;
  readonly hub: number;
  readonly logging: number;
}

/** The emulator ports firebase.json names, so the page and every other client find them. */
export function emulatorPorts(firebaseJsonPath = join(REPO_ROOT, 'firebase.json')): EmulatorPorts {
  const parsed = JSON.parse(readFileSync(firebaseJsonPath, 'utf8')) as { emulators?: Record<string, { host?: string; port?: number } | undefined> };
  const emulators = parsed.emulators ?? {};
  const port = (name: string): number => {
    const value = emulators[name]?.port;
    if (typeof value !== 'number') throw new Error(`firebase.json names no port for the ${name} emulator`);
    return value;
  };
  return {
    host: emulators.functions?.host ?? '127.0.0.1',
    firestore: port('firestore'),
    functions: port('functions'),
    tasks: port('tasks'),
    auth: port('auth'),
    hub: port('hub'),
    logging: port('logging'),
  };
}

/** What the chat page reads from /config.json: where the emulators are. */
export interface WebConfig {
  readonly projectId: string;
  /** Any non-empty string works against the emulators. */
  readonly apiKey: string;
  /** Base URL of the HTTP functions: `${functionsBaseUrl}/submitJob`. */
  readonly functionsBaseUrl: string;
  readonly authEmulatorUrl: string;
  readonly firestoreHost: string;
  readonly firestorePort: number;
}

export function webConfig(addresses: { readonly functions: string; readonly auth: string; readonly firestore: string }, projectId = DEMO_PROJECT_ID): WebConfig {
  const [firestoreHost = '127.0.0.1', firestorePort = ''] = addresses.firestore.split(':');
  return {
    projectId,
    apiKey: 'demo-key',
    functionsBaseUrl: `http://${addresses.functions}/${projectId}/${REGION}`,
    authEmulatorUrl: `http://${addresses.auth}`,
    firestoreHost,
    firestorePort: Number(firestorePort),
  };
}

export class PortInUseError extends Error {
  constructor(readonly port: number, what: string) {
    super(
      `Port ${port} (${what}) is already in use. Is another \`npm start\`, \`npm run demo\` or \`npm test\` running? ` +
        `\`ss -ltnp 'sport = :${port}'\` shows which process holds it.`,
    );
    this.name = 'PortInUseError';
  }
}

async function portIsFree(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createNetServer();
    server.once('error', () => resolve(false));
    server.listen(port, host, () => server.close(() => resolve(true)));
  });
}

/** Fails fast, naming the port, rather than letting a half-started stack report it later. */
export async function assertPortsFree(host: string, ports: Readonly<Record<string, number>>): Promise<void> {
  for (const [what, port] of Object.entries(ports)) {
    if (!(await portIsFree(host, port))) throw new PortInUseError(port, what);
  }
}

// ------------------------------------------------------------------------------------------------
// The page's static server

const CONTENT_TYPES: Readonly<Record<string, string>> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.map': 'application/json; charset=utf-8',
  '.json': 'application/json; charset=utf-8',
  '.txt': 'text/plain; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
};

export interface WebServer {
  readonly url: string;
  readonly port: number;
  close(): Promise<void>;
}

/**
 * Serves the built page (GET and HEAD only, files under `root` only) and /config.json. Port 0
 * picks a free port, which is what the browser test does.
 */
export async function serveWeb(options: { readonly config: WebConfig; readonly port: number; readonly host?: string; readonly root?: string }): Promise<WebServer> {
  const root = options.root ?? WEB_DIST;
  if (!existsSync(join(root, 'index.html'))) throw new Error(`${root}/index.html does not exist: build the page first (npm run build:web)`);
  const configBody = JSON.stringify(options.config);
  const handle = (request: IncomingMessage, response: ServerResponse): void => {
    const send = (status: number, type: string, body: string | Buffer): void => {
      response.writeHead(status, { 'content-type': type, 'cache-control': 'no-store', 'x-content-type-options': 'nosniff' });
      response.end(request.method === 'HEAD' ? undefined : body);
    };
    if (request.method !== 'GET' && request.method !== 'HEAD') {
      response.setHeader('allow', 'GET, HEAD');
      return send(405, 'text/plain; charset=utf-8', 'Method not allowed\n');
    }
    const pathname = decodeURIComponent(new URL(request.url ?? '/', 'http://localhost').pathname);
    if (pathname === '/config.json') return send(200, CONTENT_TYPES['.json'] ?? 'application/json', configBody);
    // A page is also served at its name without `.html` (`/ops` → ops.html), as Hosting's cleanUrls does.
    const file = normalize(join(root, pathname === '/' ? 'index.html' : extname(pathname) === '' ? `${pathname}.html` : pathname));
    const inside = relative(root, file);
    if (inside.startsWith('..') || inside.startsWith(sep) || !existsSync(file) || !statSync(file).isFile()) {
      return send(404, 'text/plain; charset=utf-8', 'Not found\n');
    }
    send(200, CONTENT_TYPES[extname(file)] ?? 'application/octet-stream', readFileSync(file));
  };
  const server = createHttpServer((request, response) => {
    try {
      handle(request, response);
    } catch {
      if (!response.headersSent) response.writeHead(400, { 'content-type': 'text/plain; charset=utf-8' });
      response.end('Bad request\n');
    }
  });
  const host = options.host ?? '127.0.0.1';
  await new Promise<void>((resolve, reject) => {
    server.once('error', (error: NodeJS.ErrnoException) => reject(error.code === 'EADDRINUSE' ? new PortInUseError(options.port, 'the chat page') : error));
    server.listen(options.port, host, () => resolve());
  });
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : options.port;
  return {
    url: `http://${host}:${port}/`,
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

// ------------------------------------------------------------------------------------------------
// The sweeper

export interface Sweeper {
  /** One pass now (the timer does the same every `everyMs`). */
  runNow(): Promise<SweepReport>;
  stop(): Promise<void>;
}

/**
 * The sweeper on a timer, in this process: the same `sweep()` the deployed `sweepJobs` trigger
 * runs, with the same store, queue and engine options (PHASELINE_* variables), against the
 * emulators. Why not over HTTP: firebase-tools does not load `onSchedule` functions unless the
 * Pub/Sub emulator runs (a Java download, not available here), and a public "sweep now" HTTP
 * endpoint would be deployed to production with the rest. What this leaves untested locally is
 * only the trigger's thin wrapper (the schedule time header), which the emulator tests cover.
 */
export function startSweeper(options: { readonly projectId: string; readonly firestoreHost: string; readonly tasksHost: string; readonly everyMs: number; readonly log: Log }): Sweeper {
  // The Admin SDK reads the emulator hosts from the environment when it makes its clients.
  process.env.FIRESTORE_EMULATOR_HOST = options.firestoreHost;
  process.env.CLOUD_TASKS_EMULATOR_HOST = options.tasksHost;
  // Not on Google Cloud: the auth library need not probe for a metadata server (it warned when one answered 403).
  process.env.METADATA_SERVER_DETECTION ??= 'none';
  const app: App = initializeApp(
    // A service account ID spares the enqueue a metadata-server probe (as in functions/src/triggers/admin.ts).
    { projectId: options.projectId, serviceAccountId: `${options.projectId}@appspot.gserviceaccount.com` },
    `phaseline-local-sweeper-${process.pid}`,
  );
  const deps: SweepDeps = {
    store: new JobStore(getFirestore(app), systemClock, engineOptionsFromEnv()),
    queue: cloudTasksQueue(app),
    log: (message: string) => options.log(`sweeper: ${message}`),
    // As the deployed sweepJobs: stopped notify jobs' effects are checked with PHASELINE_RECEIVER_URL's receiver.
    stoppedEffects: { settlerFor: notifyStoppedEffects() },
  };
  let inFlight: Promise<SweepReport> | null = null;
  const runNow = (): Promise<SweepReport> => {
    inFlight ??= sweep(deps, Date.now()).finally(() => {
      inFlight = null;
    });
    return inFlight;
  };
  const sayWhatActed = (report: RecoverySweepReport & { readonly stoppedEffects?: SweepReport['stoppedEffects'] }): void => {
    const acted = (['reclaimed', 'unitsReclaimed', 'quarantined', 'redispatched', 'unitsRedispatched', 'parkedUnits', 'errors', 'enqueueFailures'] as const).filter((key) => report[key] > 0);
    const stopped = report.stoppedEffects;
    const effects = stopped ? (['checked', 'settled', 'pending', 'errors'] as const).filter((key) => stopped[key] > 0).map((key) => `stopped-job effects ${key} ${stopped[key]}`) : [];
    const said = [...acted.map((key) => `${key} ${report[key]}`), ...('resumed' in report && report.resumed > 0 ? [`resumed ${report.resumed}`] : []), ...effects];
    if (said.length > 0) options.log(`sweeper: ${said.join(', ')}`);
  };
  // As the deployed sweepJobs: one run a minute (everyMs), a full sweep and then recovery passes every sweepIntervalSeconds until the run's minute is over.
  let stopped = false;
  const stopWaiting = new AbortController();
  const wait: Wait = (ms) =>
    new Promise((resolve) => {
      const stop = (): void => {
        clearTimeout(timer);
        resolve();
      };
      // Each wait's listener goes when its timer fires: the sweeper waits thousands of times in a soak.
      const timer = setTimeout(() => {
        stopWaiting.signal.removeEventListener('abort', stop);
        resolve();
      }, ms);
      timer.unref();
      stopWaiting.signal.addEventListener('abort', stop, { once: true });
    });
  let minute: Promise<unknown> | null = null;
  const runMinute = (): void => {
    if (minute !== null || stopped) return;
    const scheduledAtMs = Date.now();
    const passing: Wait = async (ms) => {
      await wait(ms);
      // Stopping: the remaining passes are skipped (the clock is past them once the run resumes).
      if (stopped) throw new Error('the sweeper stopped');
    };
    minute = sweepMinute({ ...deps, clock: systemClock, wait: passing }, scheduledAtMs, options.everyMs)
      .then(
        ({ full, recovery }) => [full, ...recovery].forEach(sayWhatActed),
        (error: unknown) => {
          if (!stopped) options.log(`sweeper: the run failed (${error instanceof Error ? error.message : String(error)}); the next one tries again`);
        },
      )
      .finally(() => {
        minute = null;
      });
  };
  runMinute();
  const timer = setInterval(runMinute, options.everyMs);
  timer.unref();
  return {
    runNow,
    stop: async () => {
      stopped = true;
      clearInterval(timer);
      stopWaiting.abort();
      await Promise.allSettled([inFlight, minute]);
      await deleteApp(app);
    },
  };
}

// ------------------------------------------------------------------------------------------------
// Processes

/** Runs a command to completion with its output on this terminal; rejects on a non-zero exit. */
export function run(command: string, args: readonly string[], options: { readonly cwd?: string; readonly quiet?: boolean } = {}): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: options.cwd ?? REPO_ROOT, stdio: options.quiet ? ['ignore', 'pipe', 'pipe'] : 'inherit' });
    let output = '';
    child.stdout?.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr?.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.once('error', reject);
    child.once('exit', (code, signal) => {
      if (code === 0) resolve();
      else reject(new Error(`\`${command} ${args.join(' ')}\` exited with ${signal ?? code}${output ? `:\n${output.trim()}` : ''}`));
    });
  });
}

/** Stops registered things in reverse order, once; anything registered after that is stopped at once. */
class Teardown {
  private readonly steps: { readonly name: string; readonly stop: () => Promise<void> }[] = [];
  private stopping: Promise<void> | null = null;

  constructor(private readonly log: Log) {}

  get stopped(): boolean {
    return this.stopping !== null;
  }

  add(name: string, stop: () => Promise<void>): void {
    if (this.stopping) {
      void stop().catch(() => undefined);
      return;
    }
    this.steps.push({ name, stop });
  }

  stop(): Promise<void> {
    this.stopping ??= (async () => {
      for (let step = this.steps.pop(); step; step = this.steps.pop()) {
        try {
          await step.stop();
        } catch (error) {
          this.log(`stopping ${step.name} failed: ${error instanceof Error ? error.message : String(error)}`);
        }
      }
    })();
    return this.stopping;
  }
}

export class StackStoppedError extends Error {
  constructor() {
    super('The local stack was stopped while it was starting.');
    this.name = 'StackStoppedError';
  }
}

/**
 * Writes a process's output to `logFile`, each line after the wall-clock time this process read it
 * (the emulators print none, and the soak's evidence is read against fault and commit times; on a
 * loaded machine a stamp can trail the line's printing by this event loop's delay), keeps the tail
 * for error messages, and echoes lines chosen by `echo`.
 */
function followOutput(child: ChildProcess, logFile: string, echo: (line: string) => void): () => string {
  const file = createWriteStream(logFile, { flags: 'a' });
  const tail: string[] = [];
  const streams = [child.stdout, child.stderr].filter((stream) => stream !== null);
  let open = streams.length;
  for (const stream of streams) {
    const lines = createInterface({ input: stream });
    lines.on('line', (line) => {
      file.write(`${new Date().toISOString()} ${line}\n`);
      tail.push(line);
      if (tail.length > 40) tail.shift();
      echo(line);
    });
    // The process may exit before its last lines are read: the file ends with the last stream.
    lines.once('close', () => {
      open -= 1;
      if (open === 0) file.end();
    });
  }
  if (open === 0) file.end();
  return () => tail.join('\n');
}

/**
 * How long one readiness probe waits. The first request makes the emulator load a worker, which
 * takes many seconds on a busy machine; a probe abandoned sooner only makes it load another, and
 * the workers starting in parallel then starve each other (seen at a load average of 70: thirteen
 * workers, none ready within two minutes).
 */
const READY_PROBE_TIMEOUT_MS = 30_000;

async function answersPreflight(url: string): Promise<boolean> {
  try {
    const response = await fetch(url, { method: 'OPTIONS', signal: AbortSignal.timeout(READY_PROBE_TIMEOUT_MS) });
    return response.status === 204;
  } catch {
    return false;
  }
}

// ------------------------------------------------------------------------------------------------
// The stack

export interface LocalStackOptions {
  /** Serve the chat page (built from web/) on `webPort`. */
  readonly page: boolean;
  readonly webPort?: number;
  readonly sweepEveryMs?: number;
  /** Which lines of firebase-tools' output to show; everything goes to the log file regardless. */
  readonly echoEmulatorOutput: 'all' | 'problems' | 'none';
  /** Extra environment for the functions (for example PHASELINE_OFFLINE_SETTINGS). */
  readonly functionsEnv?: Readonly<Record<string, string>>;
  readonly log: Log;
}

export interface LocalStack {
  readonly projectId: string;
  readonly ports: EmulatorPorts;
  readonly config: WebConfig;
  readonly pageUrl: string | null;
  /** firebase-tools' output, in full. */
  readonly logFile: string;
  readonly sweeper: Sweeper;
  /** Settles with a reason if an emulator process exits while the stack runs. */
  readonly died: Promise<string>;
  readonly stop: () => Promise<void>;
}

const PROBLEM_LINE = /⚠|✘|\b(error|warn(ing)?|failed|exception)\b/i;

/**
 * Starts the stack and resolves when every part answers. On failure, or when `stop()` is called
 * while it starts (a signal), whatever was started is stopped before the promise settles.
 */
export function startLocalStack(options: LocalStackOptions): { readonly ready: Promise<LocalStack>; readonly stop: () => Promise<void> } {
  const teardown = new Teardown(options.log);
  const ready = startParts(options, teardown).catch(async (error: unknown) => {
    await teardown.stop();
    throw error;
  });
  return { ready, stop: () => teardown.stop() };
}

async function startParts(options: LocalStackOptions, teardown: Teardown): Promise<LocalStack> {
  const { log } = options;
  const checkpoint = (): void => {
    if (teardown.stopped) throw new StackStoppedError();
  };
  const projectId = DEMO_PROJECT_ID;
  const ports = emulatorPorts();
  const webPort = options.webPort ?? (Number(process.env.PHASELINE_WEB_PORT) || DEFAULT_WEB_PORT);
  const reuseFirestore = Boolean(process.env.FIRESTORE_EMULATOR_HOST);
  const needed = {
    ...(reuseFirestore ? {} : { 'Firestore emulator': ports.firestore }),
    'functions emulator': ports.functions,
    'Cloud Tasks emulator': ports.tasks,
    'Auth emulator': ports.auth,
    'emulator hub': ports.hub,
    'emulator logging': ports.logging,
    ...(options.page ? { 'the chat page': webPort } : {}),
  };
  await assertPortsFree(ports.host, needed);

  log('building the functions (npm run build)…');
  await run('npm', ['run', '--silent', 'build'], { quiet: true });
  checkpoint();
  if (options.page) {
    log('building the chat page (web/)…');
    await buildWeb();
    checkpoint();
  }

  await assertPortsFree(ports.host, needed); // again: the builds took a while
  log(`starting the Firestore emulator on ${ports.host}:${ports.firestore}…`);
  const firestore = await startFirestoreEmulator({ port: ports.firestore });
  teardown.add('the Firestore emulator', () => firestore.stop());
  checkpoint();
  await loadSecurityRules(firestore.host, projectId, join(REPO_ROOT, 'firestore.rules'));

  const logDir = mkdtempSync(join(tmpdir(), 'phaseline-'));
  const logFile = join(logDir, 'emulators.log');
  log(`starting firebase-tools' functions, tasks and auth emulators (log: ${logFile})…`);
  const env = { ...process.env, ...options.functionsEnv, CI: 'true', FIRESTORE_EMULATOR_HOST: firestore.host, GCLOUD_PROJECT: projectId };
  const emulators = spawnGroup(FIREBASE_BIN, ['emulators:start', '--only', 'functions,tasks,auth', '--project', projectId], {
    cwd: REPO_ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  // If this process dies without stopping the stack, the group goes with it.
  const killOnExit = (): void => signalGroup(emulators, 'SIGKILL');
  process.once('exit', killOnExit);
  teardown.add('the firebase-tools emulators', async () => {
    process.removeListener('exit', killOnExit);
    await stopGroup(emulators);
  });
  const echo = options.echoEmulatorOutput;
  const tail = followOutput(emulators, logFile, (line) => {
    if (echo === 'all' || (echo === 'problems' && PROBLEM_LINE.test(line))) log(`emulators │ ${line}`);
  });
  const exited: { reason: string | null } = { reason: null };
  const died = new Promise<string>((resolve) => {
    emulators.once('exit', (code, signal) => {
      exited.reason = `firebase emulators:start exited with ${signal ?? code}`;
      resolve(`${exited.reason}\n${tail()}`);
    });
  });

  const functionsHost = `${ports.host}:${ports.functions}`;
  const config = webConfig({ functions: functionsHost, auth: `${ports.host}:${ports.auth}`, firestore: firestore.host }, projectId);
  const deadline = Date.now() + READY_TIMEOUT_MS;
  // The HTTP functions answer a CORS preflight once they are loaded; the task queue is created first.
  while (!(await answersPreflight(`${config.functionsBaseUrl}/submitJob`))) {
    checkpoint();
    if (exited.reason !== null) throw new Error(`${exited.reason} before the functions were ready:\n${tail()}`);
    if (Date.now() > deadline) throw new Error(`The functions emulator did not become ready in ${READY_TIMEOUT_MS / 1000} s:\n${tail()}`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  checkpoint();
  const queue = await applyStepQueueLimits(`${ports.host}:${ports.tasks}`, `${config.functionsBaseUrl}/${STEP_FUNCTION_NAME}`, projectId, { ...process.env, ...options.functionsEnv });
  log(`step queue: ${queue.maxConcurrentDispatches} tasks at once, ${queue.maxDispatchesPerSecond} started per second at most`);

  const sweeper = startSweeper({ projectId, firestoreHost: firestore.host, tasksHost: `${ports.host}:${ports.tasks}`, everyMs: options.sweepEveryMs ?? SWEEP_EVERY_MS, log });
  teardown.add('the sweeper', () => sweeper.stop());

  let pageUrl: string | null = null;
  if (options.page) {
    const server = await serveWeb({ config, port: webPort, host: ports.host });
    teardown.add('the chat page server', () => server.close());
    pageUrl = server.url;
  }
  checkpoint();
  return { projectId, ports, config, pageUrl, logFile, sweeper, died, stop: () => teardown.stop() };
}

/**
 * firebase-tools loads the functions' definitions with the variables of their `.env` files only,
 * not this process's environment (the workers get both), so the step queue the tasks emulator made
 * has the default limits whatever the stack's environment says. This creates it again, before any
 * task is queued, through the tasks emulator's own queue API: the definition's retry settings and
 * target, with the limits the configuration module reads from that environment, as a deploy with
 * the same variables in `functions/.env` would have them.
 */
export async function applyStepQueueLimits(tasksHost: string, stepFunctionUrl: string, projectId: string, env: NodeJS.ProcessEnv): Promise<StepQueueLimits> {
  const limits = stepQueueLimitsFromEnv(env);
  const trigger = runJobStep.__endpoint.taskQueueTrigger;
  const region = runJobStep.__endpoint.region?.[0] ?? 'us-central1';
  const response = await fetch(`http://${tasksHost}/projects/${projectId}/locations/${region}/queues/${STEP_FUNCTION_NAME}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...trigger, rateLimits: limits, defaultUri: stepFunctionUrl }),
  });
  const answer = (await response.json().catch(() => null)) as { taskQueueConfig?: { rateLimits?: unknown } } | null;
  if (!response.ok || JSON.stringify(answer?.taskQueueConfig?.rateLimits) !== JSON.stringify(limits)) {
    throw new Error(`The tasks emulator did not take the step queue's limits (HTTP ${response.status}: ${JSON.stringify(answer)})`);
  }
  return limits;
}

/**
 * Ctrl-C (SIGINT) and SIGTERM stop the stack and exit; a second signal while stopping kills what
 * is left at once. Returns a function that removes the handlers.
 */
export function stopOnSignals(stop: () => Promise<void>, log: Log, exitCode = 130): () => void {
  let signals = 0;
  const onSignal = (signal: NodeJS.Signals): void => {
    signals += 1;
    if (signals > 1) {
      log(`${signal} again: exiting now (the process groups are killed on exit)`);
      process.exit(exitCode);
    }
    log(`${signal}: stopping everything this command started…`);
    void stop().then(() => {
      log('Stopped.');
      process.exit(exitCode);
    });
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  return () => {
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
  };
}
