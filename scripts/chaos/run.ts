/**
 * One soak run: the local stack with short leases and a receiver, a seeded mix of jobs submitted
 * over HTTP with bounded concurrency, seeded faults while they run, then (faults over) answers to
 * the questions about unknown effects, a quiet period, one pass settling stopped jobs' effects as
 * if their grace period were over, and the invariants checked over what Firestore, the receiver
 * and the offline toolbox's execution log hold. Everything it started is stopped, and checked to
 * be gone.
 */
import { copyFile, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { availableParallelism, loadavg, tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { deleteApp, initializeApp, type App } from 'firebase-admin/app';
import { getFirestore, type Firestore } from 'firebase-admin/firestore';
import { getFunctions } from 'firebase-admin/functions';
import { DEFAULT_SETTLE_GRACE_MS, MAX_SETTLE_RECHECK_MS } from '../../functions/src/effects/after-stop';
import type { SettleStoppedReport } from '../../functions/src/engine/settle-stopped';
import { RECEIVER_URL_VARIABLE } from '../../functions/src/pipelines/notify/config';
import { NOTIFY_PIPELINE, UNKNOWN_OPTIONS, UNKNOWN_QUESTION_PREFIX } from '../../functions/src/pipelines/notify/pipeline';
import { startFirestoreEmulator } from '../lib/firestore-emulator';
import { applyStepQueueLimits, startLocalStack, stopOnSignals, type LocalStack } from '../lib/local-stack';
import { REPO_ROOT } from '../lib/stack';
import { STEP_FUNCTION_NAME } from '../../functions/src/store/cloud-tasks-queue';
import { startFirestoreProxy } from './firestore-proxy';
import { Receiver } from '../receiver';
import { cancel, decide, signUpGranted, submit, type User } from './client';
import { collectJobs } from './collect';
import { Injector } from './faults';
import { startChaosSweeper, type ChaosSweeper } from './sweeper';
import { checkInvariants, TERMINAL } from './invariants';
import type { ReceiverView, Submission } from './model';
import { readToolExecutions, watchToolResults, type ToolResultWatch } from './tool-calls';
import { CHAOS_ENGINE_ENV, CHAOS_RECEIVER_ENV, FAULT_KINDS, faultStream, offlineSettings, planRun, type FaultKind, type FaultWeights, type JobPlan, type RunPlan } from './plan';
import { figures, recoveryByKind, type FaultRecord } from './recovery';
import { descendants, isZombie, listProcesses, signal, STACK_COMMAND, stackProcesses, type ProcessRow } from './processes';
import { Rng } from './random';
import { failed, formatReport, type FaultTally } from './report';

export interface ChaosOptions {
  readonly jobs: number;
  readonly seed: string;
  readonly concurrency?: number;
  readonly timeLimitSeconds?: number;
  readonly faultWindowSeconds?: number;
  /** The mean time between faults (`--fault-gap`, default 2 s): with fewer jobs at once, a longer gap keeps each job's share of the faults. */
  readonly faultGapSeconds?: number;
  /** Fault weights over the default mix's after the first round (`--weight kind=N`). */
  readonly faultWeights?: FaultWeights;
  /**
   * Where to keep the run's evidence for reading afterwards (`--keep DIR`): the faults with their
   * targets, every collected job, each fault's recovery, and the emulators' log.
   */
  readonly keepDir?: string;
  /** Print every fault and every job's end as it happens (default true). */
  readonly verbose?: boolean;
}

interface Tracked {
  readonly plan: JobPlan;
  readonly taskIds: string[];
  failure: string | null;
  submitting: boolean;
  status: string | null;
  waiting: { readonly reason: string; readonly questionId: string; readonly options: readonly string[] } | null;
  readonly answered: Set<string>;
  /**
   * A planned owner cancellation: waiting for the send phase, armed (the receiver will hang its next
   * apply: the cancel goes out while an effect is in flight), sent, or missed (the job finished first).
   */
  cancel: 'planned' | 'armed' | 'sent' | 'missed' | null;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
/**
 * Step and unit tasks dispatched at once on the local stack (see PHASELINE_STEP_QUEUE_CONCURRENCY in
 * docs/configuration.md). The tasks emulator keeps a task that is waiting to be retried in its
 * dispatch slot for the whole backoff (firebase-tools' taskQueue.js handleRetry), which Cloud Tasks
 * does not: at 24 slots, the soak's refused duplicates and killed steps' redeliveries (backoff up to
 * minutes) held enough of them that a reclaimed job's new task waited 15 s and more for one, until
 * the lost-task redispatch. 48 leaves room for them; tasks actually running stay bounded by the
 * jobs in flight, and so do the function workers (about 190 MB each).
 */
const STEP_QUEUE_CONCURRENCY = 48;
const LEASE_MS = Number(CHAOS_ENGINE_ENV.PHASELINE_LEASE_SECONDS) * 1000;
const POLL_MS = 1_000;
/** A notify job's send phase lasts about a second: the jobs to cancel are watched more closely. */
const CANCEL_POLL_MS = 200;
const SWEEP_EVERY_MS = 2_000;
const SWEEP_MAX_IN_FLIGHT = 1;
/** How long the emulator keeps a lock of a transaction nobody will finish (measured: about a minute), with a margin. */
const LOCK_HORIZON_MS = 65_000;

function replayCommand(plan: RunPlan, options: ChaosOptions): string {
  const extra = [
    options.concurrency === undefined ? '' : ` --concurrency ${options.concurrency}`,
    options.timeLimitSeconds === undefined ? '' : ` --time-limit ${options.timeLimitSeconds}`,
    options.faultWindowSeconds === undefined ? '' : ` --fault-window ${options.faultWindowSeconds}`,
    options.faultGapSeconds === undefined ? '' : ` --fault-gap ${options.faultGapSeconds}`,
    ...Object.entries(options.faultWeights ?? {}).map(([kind, weight]) => ` --weight ${kind}=${weight}`),
  ].join('');
  return `npm run chaos -- --jobs ${plan.jobs.length} --seed ${plan.seed}${extra}`;
}

export function clockText(ms: number): string {
  const seconds = ms / 1000;
  return `${String(Math.floor(seconds / 60)).padStart(2, '0')}:${(seconds % 60).toFixed(1).padStart(4, '0')}`;
}

/** Is the job done with as far as the run is concerned: terminal, or waiting for a person. */
function settled(job: Tracked): boolean {
  if (job.failure !== null) return true;
  if (job.status === null) return false;
  return TERMINAL.has(job.status) || (job.status === 'waiting' && job.waiting?.reason === 'decision');
}

function answerable(job: Tracked): boolean {
  const waiting = job.waiting;
  return (
    job.status === 'waiting' &&
    waiting?.reason === 'decision' &&
    waiting.questionId.startsWith(UNKNOWN_QUESTION_PREFIX) &&
    waiting.options.includes(UNKNOWN_OPTIONS.retry) &&
    !job.answered.has(waiting.questionId)
  );
}

export async function runChaos(options: ChaosOptions): Promise<number> {
  const verbose = options.verbose ?? true;
  const plan = planRun({
    jobs: options.jobs,
    seed: options.seed,
    ...(options.concurrency === undefined ? {} : { concurrency: options.concurrency }),
    ...(options.timeLimitSeconds === undefined ? {} : { timeLimitSeconds: options.timeLimitSeconds }),
    ...(options.faultWindowSeconds === undefined ? {} : { faultWindowSeconds: options.faultWindowSeconds }),
    ...(options.faultGapSeconds === undefined ? {} : { meanFaultGapSeconds: options.faultGapSeconds }),
    ...(options.faultWeights === undefined ? {} : { faultWeights: options.faultWeights }),
  });
  const replay = replayCommand(plan, options);
  const launchMs = Date.now();
  const log = (line: string): void => console.log(`[${clockText(Date.now() - launchMs)}] ${line}`);
  const mix: Record<string, number> = {};
  for (const job of plan.jobs) mix[job.pipeline] = (mix[job.pipeline] ?? 0) + 1;
  log(`chaos soak: seed ${plan.seed}, ${plan.jobs.length} jobs (${Object.entries(mix).map(([name, count]) => `${name} ${count}`).join(', ')}), concurrency ${plan.concurrency}`);
  log(`replay: ${replay}`);
  log(
    `plan: about ${plan.faults.length} faults over ${plan.faultWindowMs / 1000} s from the first running job (more while submissions go on), ${plan.waves.length} provider waves, ` +
      `time limit ${plan.timeLimitMs / 1000} s; leases ${LEASE_MS / 1000} s, sweeper every ${SWEEP_EVERY_MS / 1000} s (one pass at a time of rules 1-4, and beside it one of stopped jobs' effects and retention)`,
  );

  // The in-process sweepers read the engine settings from this process's environment; the functions get them too.
  for (const [name, value] of Object.entries(CHAOS_ENGINE_ENV)) process.env[name] = value;
  const receiver = await Receiver.start({ host: '127.0.0.1', port: 0 });
  // Both in-process sweepers (the stack's and the soak's) settle stopped notify jobs' effects with the receiver.
  for (const [name, value] of Object.entries({ ...CHAOS_RECEIVER_ENV, [RECEIVER_URL_VARIABLE]: receiver.url })) process.env[name] = value;
  // Every function worker appends its tool executions here (the offline toolbox's test instrumentation).
  const scratch = await mkdtemp(join(tmpdir(), 'phaseline-chaos-'));
  const toolExecutionLog = join(scratch, 'tool-executions.jsonl');
  // Firestore behind a proxy the soak can cut: the stack reuses an emulator named by FIRESTORE_EMULATOR_HOST.
  const firestore = await startFirestoreEmulator();
  const firestoreProxy = await startFirestoreProxy(firestore.host);
  process.env.FIRESTORE_EMULATOR_HOST = firestoreProxy.host;
  log(`Firestore emulator at ${firestore.host}${firestore.startedHere ? '' : ' (already running: it cannot be stalled)'}, reached through the proxy at ${firestoreProxy.host}`);
  const functionsEnv: Record<string, string> = {
    ...CHAOS_ENGINE_ENV,
    ...CHAOS_RECEIVER_ENV,
    PHASELINE_RECEIVER_URL: receiver.url,
    PHASELINE_PROVIDER: 'offline',
    PHASELINE_OFFLINE_SEED: String(new Rng(`${plan.seed}/offline`).int(1, 1_000_000_000)),
    PHASELINE_OFFLINE_SETTINGS: JSON.stringify(offlineSettings(plan, launchMs, { toolExecutionLog })),
    // The soak's users (signed in, granted notify) keep many jobs in flight on purpose: per-user quotas, spend caps and
    // the anonymous ceiling are tested elsewhere (quotas.test.ts, spend-limits.test.ts).
    PHASELINE_QUOTA_JOBS_IN_FLIGHT: '100',
    PHASELINE_QUOTA_SUBMITS_PER_MINUTE: '600',
    PHASELINE_QUOTA_SPEND_USD_PER_DAY: '1000',
    // The functions emulator keeps a worker process (about 190 MB) for every task that ran at once, for good:
    // without this bound a long soak's bursts (redeliveries, stalls) grew to 182 workers and filled this machine's memory.
    PHASELINE_STEP_QUEUE_CONCURRENCY: String(STEP_QUEUE_CONCURRENCY),
  };
  // firebase-tools gives a new function worker 30 s to start; on a loaded shared machine a cold start can take longer,
  // and a worker that never starts tests the emulator, not the engine.
  process.env.FUNCTIONS_DISCOVERY_TIMEOUT ??= '120';
  // The stack's own sweeper keeps its production cadence (a minute, one pass at a time); the soak drives its own (sweeper.ts).
  const handle = startLocalStack({ page: false, echoEmulatorOutput: 'none', functionsEnv, log: (line) => log(`stack: ${line}`) });
  let injector: Injector | null = null;
  let sweeper: ChaosSweeper | null = null;
  let toolWatch: ToolResultWatch | null = null;
  let app: App | null = null;
  const stopEverything = async (): Promise<void> => {
    injector?.resumeFirestore();
    injector?.resumeWorkers();
    toolWatch?.stop();
    toolWatch = null;
    await sweeper?.stop();
    sweeper = null;
    if (app) await deleteApp(app).catch(() => undefined);
    app = null;
    await handle.stop();
    await receiver.stop();
    await firestoreProxy.close();
    await firestore.stop();
  };
  const removeSignalHandlers = stopOnSignals(stopEverything, log);
  // A defect of the soak itself must not leave the stack behind: stop it, then fail with exit 2.
  const onUnexpected = (error: unknown): void => {
    log(`the soak failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
    void stopEverything().finally(() => process.exit(2));
  };
  process.on('unhandledRejection', onUnexpected);

  const runProblems: string[] = [];
  let keepScratch = false;
  const timings: [string, string][] = [];
  const mark = (what: string): void => {
    timings.push([what, clockText(Date.now() - launchMs)]);
  };
  try {
    let stack: LocalStack;
    try {
      stack = await handle.ready;
    } catch (error) {
      log(`the stack did not start: ${error instanceof Error ? error.message : String(error)}`);
      return 2;
    }
    mark('stack ready (mm:ss after launch)');
    log(`stack ready: functions at ${stack.config.functionsBaseUrl}, Firestore at ${stack.config.firestoreHost}:${stack.config.firestorePort}, receiver at ${receiver.url}`);
    // Flags that callbacks set: an object, so that the loops reading them see the changes.
    const flags: { died: string | null; watching: boolean; submitted: boolean; firstRunningAt: number | null } = {
      died: null,
      watching: true,
      submitted: false,
      firstRunningAt: null,
    };
    void stack.died.then((reason) => {
      flags.died = reason;
    });
    const processes = stackProcesses(await listProcesses(), process.pid);
    const stackPids = [processes.firebase, processes.firestore].filter((row): row is ProcessRow => row !== null);

    app = initializeApp({ projectId: stack.projectId, serviceAccountId: `${stack.projectId}@appspot.gserviceaccount.com` }, `phaseline-chaos-${process.pid}`);
    const db: Firestore = getFirestore(app);
    const rng = new Rng(`${plan.seed}/targets`);
    const activeSweeper = startChaosSweeper({ app, db, everyMs: SWEEP_EVERY_MS, maxInFlight: SWEEP_MAX_IN_FLIGHT, slowMs: 10_000, log });
    sweeper = activeSweeper;
    const activeToolWatch = watchToolResults(db, log);
    toolWatch = activeToolWatch;
    const activeInjector = new Injector({
      db,
      queue: getFunctions(app).taskQueue<Record<string, unknown>>('runJobStep'),
      receiver,
      firestoreProxy,
      sweepNow: () => Promise.race([activeSweeper.runNow().catch(() => null), sleep(3_000).then(() => null)]),
      rng,
      self: process.pid,
      remakeStepQueue: async () => {
        await applyStepQueueLimits(`${stack.ports.host}:${stack.ports.tasks}`, `${stack.config.functionsBaseUrl}/${STEP_FUNCTION_NAME}`, stack.projectId, { ...process.env, ...functionsEnv });
      },
      queueStats: () => stepQueueWaiting(`${stack.ports.host}:${stack.ports.tasks}`),
      functionsWatchedFile: join(REPO_ROOT, 'functions', 'package.json'),
      functionReloads: () => functionReloads(stack.logFile),
    });
    injector = activeInjector;
    const users: User[] = [];
    // notify is for accounts an operator granted it (core/pipeline.ts access): the soak's users are such accounts.
    for (let index = 0; index < plan.users; index += 1) users.push(await signUpGranted(stack.config, [NOTIFY_PIPELINE]));

    const faultTally = new Map<FaultKind, FaultTally>();
    const count = (kind: FaultKind, injected: boolean): void => {
      const tally = faultTally.get(kind) ?? { injected: 0, skipped: 0 };
      faultTally.set(kind, injected ? { ...tally, injected: tally.injected + 1 } : { ...tally, skipped: tally.skipped + 1 });
    };

    const tracked: Tracked[] = plan.jobs.map((job) => ({
      plan: job,
      taskIds: [],
      failure: null,
      submitting: false,
      status: null,
      waiting: null,
      answered: new Set(),
      cancel: job.cancelMidSend ? 'planned' : null,
    }));
    const deadline = launchMs + plan.timeLimitMs;
    const overTime = (): boolean => Date.now() > deadline || flags.died !== null;

    // ---- Submissions, bounded by the number of jobs in flight ----
    const t0 = Date.now();
    mark('first submission');
    const submitOne = async (job: Tracked): Promise<void> => {
      job.submitting = true;
      const user = users[job.plan.user % users.length] as User;
      const request = { pipeline: job.plan.pipeline, input: job.plan.input, idempotencyKey: job.plan.idempotencyKey };
      try {
        const first = await submit(stack.config, user, request, { giveUpAfterMs: 180_000, timeoutMs: 20_000 });
        job.taskIds.push(first.taskId);
        job.status = 'queued';
        if (job.plan.resubmit) {
          const again = await submit(stack.config, user, request, { giveUpAfterMs: 180_000, timeoutMs: 20_000 });
          job.taskIds.push(again.taskId);
          count('submit-retry', true);
          if (verbose) log(`fault submit-retry: job ${job.plan.index} submitted again with key ${request.idempotencyKey}: ${again.taskId === first.taskId ? 'same task ID' : `NEW task ID ${again.taskId}`}${again.replayed ? ' (replayed)' : ''}`);
        }
      } catch (error) {
        job.failure = error instanceof Error ? error.message : String(error);
        log(`submission ${job.plan.index} was not accepted: ${job.failure}`);
      } finally {
        job.submitting = false;
      }
    };
    const inFlight = (): number => tracked.filter((job) => job.submitting || (job.taskIds.length > 0 && !settled(job))).length;
    const submissions = (async () => {
      const pending: Promise<void>[] = [];
      for (const job of tracked) {
        while (inFlight() >= plan.concurrency && !overTime()) await sleep(200);
        if (overTime()) {
          job.failure = 'not submitted: the run hit its time limit first';
          continue;
        }
        pending.push(submitOne(job));
        await sleep(50);
      }
      await Promise.all(pending);
      mark('last submission settled');
    })();

    // ---- Watching the jobs ----
    let leaseChecked = false;
    const poll = async (): Promise<void> => {
      const open = tracked.filter((job) => job.taskIds.length > 0 && !(job.status !== null && TERMINAL.has(job.status)));
      for (let start = 0; start < open.length; start += 100) {
        const chunk = open.slice(start, start + 100);
        const snapshots = await db.getAll(...chunk.map((job) => db.doc(`jobs/${job.taskIds[0] ?? ''}`)));
        snapshots.forEach((snapshot, index) => {
          const job = chunk[index];
          if (!job || !snapshot.exists) return;
          const status = String(snapshot.get('status'));
          const waiting = snapshot.get('waiting') as { reason?: unknown; questionId?: unknown; options?: unknown } | null;
          job.waiting =
            waiting && typeof waiting.reason === 'string' && typeof waiting.questionId === 'string'
              ? { reason: waiting.reason, questionId: waiting.questionId, options: Array.isArray(waiting.options) ? waiting.options.map(String) : [] }
              : null;
          if (status !== job.status && verbose && (TERMINAL.has(status) || status === 'waiting')) {
            log(`job ${job.plan.index} (${job.plan.pipeline}, ${snapshot.id}): ${status}${status === 'waiting' ? ` (${job.waiting?.reason ?? '?'})` : ''}`);
          }
          job.status = status;
          if (status === 'running') flags.firstRunningAt ??= Date.now();
          // The functions must run with the soak's short lease (the default is minutes), or every timing here is off.
          const lease = snapshot.get('lease') as { expiresAt?: { toMillis(): number } } | null;
          const updatedAt = snapshot.get('updatedAt') as { toMillis(): number } | undefined;
          if (!leaseChecked && status === 'running' && lease?.expiresAt && updatedAt) {
            leaseChecked = true;
            const leaseMs = lease.expiresAt.toMillis() - updatedAt.toMillis();
            if (leaseMs > LEASE_MS + 5_000) runProblems.push(`the functions hold leases of ${leaseMs} ms, not ${LEASE_MS} ms: PHASELINE_LEASE_SECONDS did not reach them`);
          }
        });
      }
    };
    const watcher = (async () => {
      while (flags.watching) {
        await poll().catch((error: unknown) => log(`poll failed (retrying): ${error instanceof Error ? error.message : String(error)}`));
        await sleep(POLL_MS);
      }
    })();

    // ---- Owner cancellations: a planned one is sent when its notify job is seen sending ----
    const cancellations: Promise<void>[] = [];
    const cancelOne = async (job: Tracked, taskId: string): Promise<void> => {
      const user = users[job.plan.user % users.length] as User;
      // Counted at the end by the job's final state: a cancel whose answer timed out may have landed all the same.
      try {
        const status = await cancel(stack.config, user, taskId, 'chaos soak: the owner cancels while the job sends');
        if (verbose || status !== 200) log(`fault owner-cancel: job ${job.plan.index} (${taskId}) cancelled with an effect in flight: HTTP ${status}`);
      } catch (error) {
        log(`fault owner-cancel: job ${job.plan.index} (${taskId}), no answer: ${error instanceof Error ? error.message : String(error)}`);
      }
    };
    const canceller = (async () => {
      while (flags.watching) {
        const planned = tracked.filter((job) => (job.cancel === 'planned' || job.cancel === 'armed') && job.taskIds.length > 0);
        const snapshots = planned.length === 0 ? [] : await db.getAll(...planned.map((job) => db.doc(`jobs/${job.taskIds[0] ?? ''}`))).catch(() => []);
        const inSend: { job: Tracked; taskId: string }[] = [];
        snapshots.forEach((snapshot, index) => {
          const job = planned[index];
          const status: unknown = snapshot.get('status');
          if (!job || typeof status !== 'string') return;
          if (TERMINAL.has(status)) {
            job.cancel = 'missed';
            if (verbose) log(`fault owner-cancel (no target): job ${job.plan.index} (${snapshot.id}) was ${status} before it was seen sending`);
          } else if (snapshot.get('phase') === 'send' && (status === 'running' || status === 'waiting')) {
            inSend.push({ job, taskId: snapshot.id });
          }
        });
        for (const { job, taskId } of inSend) {
          if (job.cancel === 'planned') {
            // The next apply (most likely this job's) is applied and never answered: for a couple of seconds it is in flight.
            receiver.inject({ op: 'apply', mode: 'apply-then-hang', times: 1 });
            job.cancel = 'armed';
            continue;
          }
          const inFlight = await db
            .collection(`jobs/${taskId}/effects`)
            .where('state', 'in', ['applying', 'unknown'])
            .limit(1)
            .get()
            .then(
              (effects) => !effects.empty,
              () => false,
            );
          if (!inFlight || job.cancel !== 'armed') continue;
          job.cancel = 'sent';
          cancellations.push(cancelOne(job, taskId));
        }
        await sleep(CANCEL_POLL_MS);
      }
    })();

    // ---- Faults: the clock starts when the first job runs (function workers start cold) ----
    void submissions.then(() => {
      flags.submitted = true;
    });
    const allSettled = (): boolean => flags.submitted && tracked.every(settled);
    while (flags.firstRunningAt === null && Date.now() < t0 + 30_000 && !overTime()) await sleep(100);
    const faultClock = flags.firstRunningAt ?? Date.now();
    mark('first job running: fault clock starts');
    // The machine's load while the faults land: every wall-clock figure here moves with it (worker cold starts most).
    const loads: number[] = [];
    const loadSampler = setInterval(() => loads.push(loadavg()[0] ?? 0), 10_000);
    loadSampler.unref();
    // The waves run on the functions' clock whatever happens here; say so when each begins.
    const waveTimers = plan.waves.map((wave) =>
      setTimeout(
        () => {
          if (verbose) log(`provider wave begins: every model call answers ${wave.status} for ${wave.endMs - wave.startMs} ms`);
        },
        Math.max(0, launchMs + wave.startMs - Date.now()),
      ),
    );
    // The last fault that can leave a transaction open (a killed or frozen worker, a cut or stalled Firestore, lost answers).
    let lastDisruptionMs = 0;
    const firestoreOutages: { readonly startMs: number; readonly endMs: number }[] = [];
    const faultRecords: FaultRecord[] = [];
    const windowOver = (): boolean => Date.now() >= faultClock + plan.faultWindowMs && flags.submitted;
    for (const fault of faultStream(plan.seed, plan.meanFaultGapMs, plan.faultWeights)) {
      while (Date.now() < faultClock + fault.atMs && !allSettled() && !overTime() && !windowOver()) await sleep(100);
      if (allSettled() || overTime() || windowOver()) break;
      const startedMs = Date.now();
      let outcome;
      try {
        outcome = await activeInjector.inject(fault.spec);
      } catch (error) {
        outcome = { injected: false, detail: `injection failed: ${error instanceof Error ? error.message : String(error)}` };
      }
      count(fault.spec.kind, outcome.injected);
      // The injection of a Firestore stall or cut returns when Firestore is back.
      if (outcome.injected && fault.spec.kind === 'checkpoint-write-failure') firestoreOutages.push({ startMs: outcome.atMs ?? startedMs, endMs: Date.now() });
      if (outcome.injected && DISRUPTIVE.has(fault.spec.kind)) lastDisruptionMs = Math.max(lastDisruptionMs, Date.now() + (outcome.holdsOnMs ?? 0));
      let number = '';
      if (outcome.injected) {
        faultRecords.push({
          index: faultRecords.length + 1,
          kind: fault.spec.kind,
          atMs: outcome.atMs ?? startedMs,
          targets: outcome.targets ?? [],
          ...(outcome.stopsHolderByMs === undefined ? {} : { stopsHolderByMs: outcome.stopsHolderByMs }),
        });
        number = ` #${faultRecords.length}`;
      }
      const tookMs = Date.now() - startedMs;
      const when = tookMs > 1_000 ? ` [began at ${clockText(startedMs - launchMs)}, took ${tookMs} ms]` : '';
      if (verbose || !outcome.injected) log(`fault${number} ${fault.spec.kind}${outcome.injected ? '' : ' (no target)'}: ${outcome.detail}${when}`);
    }
    log(allSettled() ? 'every job has settled: no more faults' : `fault injection over (${Math.round((Date.now() - faultClock) / 1000)} s)`);
    await activeInjector.restoreAll();
    // Waves are fixed in the functions' settings: wait out the last one while jobs still run, then count
    // those that began after the fault clock started and before the faults stopped.
    const lastWaveEnd = plan.waves.reduce((end, wave) => Math.max(end, launchMs + wave.endMs), 0);
    while (Date.now() < lastWaveEnd && !allSettled() && !overTime()) await sleep(200);
    const faultsStoppedAt = Date.now();
    for (const timer of waveTimers) clearTimeout(timer);
    for (const wave of plan.waves) {
      const startMs = launchMs + wave.startMs;
      const inside = startMs >= faultClock && startMs < faultsStoppedAt;
      count('provider-wave', inside);
    }
    mark('faults stopped');
    clearInterval(loadSampler);
    log('faults stopped: Firestore running, the receiver up with no armed faults, no provider wave ahead');

    // ---- Settling: answer the questions about unknown effects, wait for the rest ----
    let decisionsAnswered = 0;
    for (;;) {
      await submissions;
      for (const job of tracked.filter(answerable)) {
        const waiting = job.waiting;
        const taskId = job.taskIds[0];
        if (!waiting || taskId === undefined) continue;
        job.answered.add(waiting.questionId);
        const user = users[job.plan.user % users.length] as User;
        const status = await decide(stack.config, user, taskId, waiting.questionId, UNKNOWN_OPTIONS.retry).catch(() => 0);
        if (status === 200) decisionsAnswered += 1;
        job.status = 'queued';
        log(`job ${job.plan.index} (${taskId}) asked "${waiting.questionId}"; answered "${UNKNOWN_OPTIONS.retry}" (HTTP ${status})`);
      }
      if (tracked.every((job) => settled(job) && !answerable(job))) break;
      if (overTime()) {
        runProblems.push(`the run hit its ${flags.died === null ? `time limit (${plan.timeLimitMs / 1000} s)` : `stack failure: ${flags.died}`} with ${tracked.filter((job) => !settled(job)).length} jobs unsettled`);
        break;
      }
      await sleep(POLL_MS);
    }
    mark('every job settled');
    await Promise.all(cancellations);
    for (const job of tracked) if (job.cancel !== null) count('owner-cancel', job.cancel === 'sent' && job.status === 'cancelled');

    // Late writes of fenced-out workers still in flight land (or are refused) before the documents are read:
    // a lease and a little, or until a lock left by the last disruptive fault has expired, whichever is later.
    const quietUntil = Math.max(Date.now() + LEASE_MS + 2_000, lastDisruptionMs + LOCK_HORIZON_MS);
    log(`quiet period of ${Math.round((quietUntil - Date.now()) / 1000)} s before reading the results (late writes land or are refused)`);
    await sleep(quietUntil - Date.now());

    // Stopped jobs' effects, checked as the sweeper would once every job's grace period is over (the grace
    // allows for a request sent just before the stop that is still on its way). None can be on its way after the
    // quiet period; one that were would show as a misreported effect (applied, ledger says failed).
    const settleReports: SettleStoppedReport[] = [];
    // Dated past the longest recheck as well: a check the sweeper moved on because the receiver could not answer
    // during the faults (settleRecheckAtMs: as long again as the job had been stopped, at most an hour) is only due then.
    for (const aheadMs of [MAX_SETTLE_RECHECK_MS + DEFAULT_SETTLE_GRACE_MS + 1_000, 2 * MAX_SETTLE_RECHECK_MS + DEFAULT_SETTLE_GRACE_MS + 1_000]) {
      const settle = await activeSweeper.settleStoppedAt(Date.now() + aheadMs).catch((error: unknown) => {
        runProblems.push(`the final pass over stopped jobs' effects failed: ${error instanceof Error ? error.message : String(error)}`);
        return null;
      });
      if (settle === null) break;
      settleReports.push(settle);
      log(
        `stopped jobs' effects, settled as at ${Math.round(aheadMs / 1000)} s from now: ${settle.checked} checked, ${settle.settled} settled, ` +
          `${settle.pending} pending, ${settle.errors} errors (${settle.effectsFoundApplied} found applied, ${settle.effectsNotApplied} not applied)`,
      );
      // A target that could not answer, or a job that could not be handled, is asked again as the sweeper would: later.
      if (settle.pending === 0 && settle.errors === 0) break;
    }
    mark('stopped jobs\' effects settled');

    flags.watching = false;
    await Promise.all([watcher, canceller]);
    const jobs = await collectJobs(db);
    activeToolWatch.stop();
    const toolResultsSeen = activeToolWatch.seen();
    const toolLog = await readToolExecutions(toolExecutionLog);
    const receiverView: ReceiverView = {
      applications: receiver.applied().map((application) => {
        const identity = (application.intent as { identity?: unknown } | null)?.identity;
        return { key: application.key, kind: application.kind, identity: typeof identity === 'string' ? identity : null };
      }),
      requests: receiver.requests.map((request) => ({ op: request.op, key: request.key, outcome: request.outcome })),
    };
    const submissionsSeen: Submission[] = tracked.map((job) => ({
      index: job.plan.index,
      pipeline: job.plan.pipeline,
      idempotencyKey: job.plan.idempotencyKey,
      taskIds: job.taskIds,
      failure: job.failure,
    }));
    mark('results read');
    const sweeps = activeSweeper.stats();
    // A pass that overlapped an injected Firestore stall or cut waited on Firestore itself, not on a lock.
    const slowDuringOutage = sweeps.slow.filter((pass) => firestoreOutages.some((outage) => outage.startMs < pass.startedMs + pass.tookMs && outage.endMs > pass.startedMs)).length;
    const steps = await stepOutcomes(stack.logFile);
    const recordedResults = jobs.reduce((sum, job) => sum + job.transcripts.reduce((inJob, transcript) => inJob + transcript.toolResultIds.length, 0), 0);
    if (recordedResults > 0 && toolLog.executions.length === 0) {
      runProblems.push('transcripts hold tool results but the offline toolbox logged no execution: toolExecutionLog did not reach the functions');
    }
    const recovery = recoveryByKind(faultRecords, jobs, FAULT_KINDS);
    for (const kind of recovery) {
      for (const missed of kind.notRecovered) log(`recovery: fault #${missed.fault.index} ${kind.kind}: job ${missed.jobId} committed no progress after it`);
    }
    if (options.keepDir !== undefined) {
      await keepEvidence(options.keepDir, { plan, launchMs, faults: faultRecords, recovery, jobs, slowSweeps: sweeps.slow, firestoreOutages }, [stack.logFile, toolExecutionLog]);
      log(`evidence kept in ${options.keepDir}`);
    }
    const deploys = faultTally.get('rolling-deploy')?.injected ?? 0;
    const reloads = await functionReloads(stack.logFile);
    const lastSettle = settleReports.at(-1);
    const extra: [string, string][] = [
      ['sweeper passes / slower than 10 s / longest', `${sweeps.passes} / ${sweeps.slowPasses} / ${(sweeps.longestPassMs / 1000).toFixed(1)} s`],
      ['  slower than 10 s while Firestore itself was stalled or cut', `${slowDuringOutage} of ${sweeps.slow.length}`],
      ['  of them rules 1-4 (leases, lost tasks, waits)', `${sweeps.rulePasses} / ${sweeps.slowRulePasses} / ${(sweeps.longestRulePassMs / 1000).toFixed(1)} s`],
      ['sweeper: job / unit leases reclaimed, quarantined, resumed', `${sweeps.reclaimed} / ${sweeps.unitsReclaimed}, ${sweeps.quarantined}, ${sweeps.resumed}`],
      ['sweeper: stopped jobs with effects checked / settled', `${sweeps.stoppedChecked} / ${sweeps.stoppedSettled}`],
      [
        'final settle pass: checked, settled, pending, errors',
        lastSettle ? `${lastSettle.checked}, ${lastSettle.settled}, ${lastSettle.pending}, ${lastSettle.errors}${settleReports.length > 1 ? ` (pass ${settleReports.length})` : ''}` : 'none completed',
      ],
      [
        'transcript listener: results seen, restarts; log unread',
        `${toolResultsSeen.length}; ${activeToolWatch.restarts()}; ${toolLog.unreadable}`,
      ],
      ['step outcomes in the functions\' log', [...steps].map(([kind, count]) => `${kind} ${count}`).join(', ') || 'none found'],
      ['rolling deploys injected / function reloads in the emulators\' log', `${deploys} / ${reloads}`],
      [
        'load during the faults (1-min average every 10 s): mean / max',
        loadFigures(loads),
      ],
    ];
    if (reloads < deploys) runProblems.push(`${deploys} rolling deploys were injected, but firebase-tools reloaded the functions ${reloads} times`);

    log('stopping the stack…');
    await stopEverything();
    runProblems.push(...(await leftovers(stackPids, receiver.url, log)));
    mark('stopped (total)');

    const check = checkInvariants({ jobs, submissions: submissionsSeen, receiver: receiverView, toolResultsSeen, toolExecutions: toolLog.executions });
    // Every execution runs inside a claimed step: one that names no claim means the step scope did not reach the toolbox.
    const unclaimed = check.stats.toolExecutionsWithoutClaim;
    if (unclaimed > 0) runProblems.push(`${unclaimed} of ${toolLog.executions.length} logged tool executions name no claim: the step's epoch did not reach the toolbox`);
    const report = formatReport({ seed: plan.seed, jobs: plan.jobs.length, mix, check, faults: faultTally, recovery: recovery.map(figures), decisionsAnswered, timings, runProblems, replay, extra });
    console.log(`\n${report}`);
    const broke = failed({ check, runProblems });
    keepScratch = broke;
    if (broke) console.log(`The offline toolbox's execution log is kept at ${toolExecutionLog}`);
    return broke ? 1 : 0;
  } finally {
    await stopEverything().catch(() => undefined);
    if (!keepScratch) await rm(scratch, { recursive: true, force: true }).catch(() => undefined);
    removeSignalHandlers();
    process.removeListener('unhandledRejection', onUnexpected);
  }
}

/** The run's evidence as files: `run.json` (plan, faults, recovery, collected jobs) and copies of the logs named. */
async function keepEvidence(dir: string, evidence: Readonly<Record<string, unknown>>, logs: readonly string[]): Promise<void> {
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'run.json'), JSON.stringify(evidence));
  for (const file of logs) await copyFile(file, join(dir, basename(file))).catch(() => undefined);
}

/** Faults that can leave a worker's transaction open (its lock held) or a worker stopped. */
const DISRUPTIVE: ReadonlySet<FaultKind> = new Set(['worker-kill', 'worker-freeze', 'task-loss', 'commit-answer-lost', 'rolling-deploy', 'checkpoint-write-failure']);

/**
 * The load while the faults landed, from 1-minute averages sampled every 10 s: the first minute's
 * samples are left out when there are later ones (they average the stack's start in).
 */
export function loadFigures(samples: readonly number[]): string {
  const settled = samples.length > 6 ? samples.slice(6) : samples;
  if (settled.length === 0) return 'not sampled';
  const mean = settled.reduce((sum, load) => sum + load, 0) / settled.length;
  return `${mean.toFixed(1)} / ${Math.max(...settled).toFixed(1)} on ${availableParallelism()} cores`;
}

/** Tasks waiting (not dispatched) in the tasks emulator's step queue, from its statistics route. */
async function stepQueueWaiting(tasksHost: string): Promise<number | null> {
  const response = await fetch(`http://${tasksHost}/queueStats`, { signal: AbortSignal.timeout(2_000) });
  const stats = (await response.json()) as Record<string, { numberOfTasks?: unknown }>;
  const entry = Object.entries(stats).find(([key]) => key.endsWith(`-${STEP_FUNCTION_NAME}`))?.[1];
  return typeof entry?.numberOfTasks === 'number' ? entry.numberOfTasks : null;
}

/** How many times firebase-tools loaded the functions' definitions after the first (a reload: a rolling deploy). */
export async function functionReloads(logFile: string): Promise<number> {
  const text = await readFile(logFile, 'utf8').catch(() => '');
  return Math.max(0, [...text.matchAll(/Loaded functions definitions from source/g)].length - 1);
}

/**
 * How the steps ended, from the functions' own log (runJobStep logs each outcome): a fenced-out
 * worker's step ends `ownership-lost`, a duplicate or stale task's `not-claimable`.
 */
export async function stepOutcomes(logFile: string): Promise<Map<string, number>> {
  const counts = new Map<string, number>();
  const text = await readFile(logFile, 'utf8').catch(() => '');
  for (const match of text.matchAll(/"outcome":\{"kind":"([a-z-]+)"/g)) {
    const kind = match[1] ?? '?';
    counts.set(kind, (counts.get(kind) ?? 0) + 1);
  }
  return new Map([...counts].sort((a, b) => b[1] - a[1]));
}

/**
 * Anything of the stack still alive after the stop: a process of the firebase-tools or Firestore
 * process groups, or a java, firebase or function-worker process below this one. Zombies (exited,
 * waiting to be reaped by whoever adopted them) do not count. What is found is killed and reported.
 */
export async function leftovers(started: readonly ProcessRow[], receiverUrl: string | null, log: (line: string) => void): Promise<string[]> {
  const problems: string[] = [];
  const groups = new Set(started.map((row) => row.pgid));
  const rows = (await listProcesses()).filter((row) => !isZombie(row) && row.pid !== process.pid);
  const below = new Set(descendants(rows, process.pid).map((row) => row.pid));
  const left = rows.filter((row) => groups.has(row.pgid) || (below.has(row.pid) && STACK_COMMAND.test(row.args)));
  if (left.length > 0) {
    problems.push(`processes left after the stop (now killed): ${left.map((row) => `${row.pid} ${row.args.slice(0, 80)}`).join('; ')}`);
    for (const row of left) signal(row.pid, 'SIGKILL');
  }
  const receiverAnswers =
    receiverUrl !== null &&
    (await fetch(`${receiverUrl}/health`, { signal: AbortSignal.timeout(2_000) }).then(
      () => true,
      () => false,
    ));
  if (receiverAnswers) problems.push(`the receiver still answers at ${receiverUrl} after the stop`);
  log(
    `cleanup: ${left.length === 0 ? 'no java, firebase or function-worker process left' : `${left.length} processes were left and killed`} ` +
      `(process groups ${[...groups].join(', ')} and this process's descendants)${receiverUrl === null ? '' : `; the receiver ${receiverAnswers ? 'still answers' : 'is closed'}`}`,
  );
  return problems;
}
