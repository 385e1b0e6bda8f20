/**
 * `npm run chaos -- --kill-all-once`: every function worker SIGKILLed at once, mid-job.
 *
 * On the real local stack (the official Firestore emulator, firebase-tools' functions, tasks and
 * auth emulators, the stack's own sweeper at its production cadence of a minute) with the
 * engine's defaults except a 5 s heartbeat and a 10 s stale-heartbeat threshold (why: see
 * KILL_ALL_ENGINE_ENV; `--engine-defaults` keeps every default, flags set either):
 *
 *   1. a warm-up research job (3 experts, 1 section: it starts a worker per expert), not measured;
 *   2. a research job run fault-free, timed from the submit request to the commit of its
 *      completion (the job's `completed` event);
 *   3. the same kind of job (another question and Idempotency-Key), and once it is mid-job (in the
 *      expert-content fan-out, at least one section recorded, a step in flight in a worker), every
 *      function worker process of the stack is SIGKILLed at once; Cloud Tasks redelivers the
 *      killed steps, firebase-tools starts new workers, and the redelivered tasks take the steps
 *      over once their holders' heartbeats are stale. Timed the same way.
 *
 * It prints the settings (the engine variables the functions and the sweeper got, and every
 * resolved engine option), both times and their difference, what was killed and how the job
 * recovered (take-overs by redelivered tasks and reclaims by the sweeper, from the job's
 * timeline), and the soak's invariants over the jobs. It exits 1 when the faulted job did not
 * complete, published other than exactly one result, took longer than the fault-free time plus
 * the allowance (30 s), or an invariant broke; 2 when the run itself could not be made (the stack
 * did not start, the job finished before it could be hit).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { availableParallelism, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { deleteApp, initializeApp, type App } from 'firebase-admin/app';
import { getFirestore, type Firestore } from 'firebase-admin/firestore';
import { DECLARED_VARIABLES, engineOptionsFromEnv } from '../../functions/src/config/environment';
import { DEFAULT_ENGINE_OPTIONS, type EngineOptions } from '../../functions/src/core/options';
// Only for the task queue's retry config as the trigger declares it (read, not restated): its backoff paces the redeliveries.
import { runJobStep } from '../../functions/src';
import { startLocalStack, stopOnSignals, type LocalStack, SWEEP_EVERY_MS } from '../lib/local-stack';
import { signUp, submit } from './client';
import { collectJobs } from './collect';
import { leaseHolders, type Holder } from './faults';
import { checkInvariants, TERMINAL } from './invariants';
import type { Submission } from './model';
import { listProcesses, signal, stackProcesses, workerPid, isZombie, type ProcessRow } from './processes';
import { Rng } from './random';
import { clockText, leftovers, stepOutcomes } from './run';
import { readToolExecutions, watchToolResults, type ToolResultWatch } from './tool-calls';

export interface KillAllOptions {
  readonly seed: string;
  /** Simulated latency of each model call (the offline provider). */
  readonly latencyMs: number;
  /** Engine variables set for the functions and the sweeper; every other engine option keeps its default. */
  readonly engineEnv: Readonly<Record<string, string>>;
  /** The allowed extra wall time of the faulted job over the fault-free one. */
  readonly allowanceSeconds: number;
  readonly warmUp: boolean;
}

/** The research job both measured runs submit (the pipeline's defaults, written out). */
export const KILL_ALL_INPUT = { experts: 3, sections: 3, wordsPerSection: 150 } as const;
const WARM_UP_INPUT = { experts: 3, sections: 1, wordsPerSection: 50 } as const;
export const DEFAULT_KILL_ALL_LATENCY_MS = 1_000;
/**
 * Nothing is shortened: the check runs with the engine's defaults (a 5 s heartbeat, a 10 s
 * stale-heartbeat threshold). Cloud Tasks redelivers a killed step after 2, then 4, 8, 16 s more
 * (the queue's 2 s minimum backoff, doubling), and a new worker's cold start comes on top of the
 * first: measured here, the redeliveries find the holder silent for about 7-10, 12-15 and
 * 20-23 s, then about 40 s. With the former defaults (10 s, 30 s) only the fourth one was past the
 * threshold (take-over about 39 s after the kill, the job 45 s late), which is why they changed;
 * with 5 s and 10 s the take-over comes at the first or second redelivery, 10-14 s after the kill.
 */
export const KILL_ALL_ENGINE_ENV: Readonly<Record<string, string>> = {};
export const DEFAULT_ALLOWANCE_SECONDS = 30;
const EXPERT_PHASE = 'expert-content';
const POLL_MS = 200;
/** Any job of the run gives up after this long (the faulted one: its baseline plus this). */
const JOB_LIMIT_MS = 600_000;

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
const seconds = (ms: number): string => `${(ms / 1000).toFixed(1)} s`;
const message = (error: unknown): string => (error instanceof Error ? error.message : String(error));

/** The engine variables (PHASELINE_* of the engine section) in effect in an environment. */
function engineEnvironment(env: NodeJS.ProcessEnv): Record<string, string> {
  const out: Record<string, string> = {};
  for (const variable of DECLARED_VARIABLES) {
    const value = env[variable.name];
    if (variable.section === 'engine' && value !== undefined && value.trim() !== '') out[variable.name] = value;
  }
  return out;
}

function optionsText(options: EngineOptions): string {
  return (Object.keys(options) as (keyof EngineOptions)[])
    .map((name) => `${name} ${options[name]}${options[name] === DEFAULT_ENGINE_OPTIONS[name] ? '' : ` (default ${DEFAULT_ENGINE_OPTIONS[name]})`}`)
    .join(', ');
}

interface JobRun {
  readonly label: string;
  readonly jobId: string;
  readonly submittedAtMs: number;
  /** The commit of the job's terminal event, else when the watcher first saw the terminal status. */
  readonly endedAtMs: number | null;
  readonly status: string;
  readonly outcome: string | null;
  readonly wallMs: number | null;
  /** The 1-minute load average when it ended (about the job's last minute). */
  readonly load: number;
}

interface KillRecord {
  readonly atMs: number;
  /** The machine's 1-minute load average then: other work on a shared machine slows the new workers' cold starts. */
  readonly load: number;
  readonly killed: readonly ProcessRow[];
  readonly gone: number;
  readonly holders: readonly Holder[];
  readonly sectionsBefore: number;
  readonly phase: string;
}

/** Every function worker of the stack, SIGKILLed in one pass; then waits (up to 5 s) for them to be gone. */
async function killAllWorkers(): Promise<{ killed: ProcessRow[]; gone: number }> {
  const workers = stackProcesses(await listProcesses(), process.pid).workers;
  const killed = workers.filter((row) => signal(row.pid, 'SIGKILL'));
  const pids = new Set(killed.map((row) => row.pid));
  let gone = 0;
  for (let round = 0; round < 25; round += 1) {
    const alive = (await listProcesses()).filter((row) => pids.has(row.pid) && !isZombie(row));
    gone = killed.length - alive.length;
    if (alive.length === 0) break;
    await sleep(200);
  }
  return { killed, gone };
}

export async function runKillAllOnce(options: KillAllOptions): Promise<number> {
  const launchMs = Date.now();
  const log = (line: string): void => console.log(`[${clockText(Date.now() - launchMs)}] ${line}`);

  // The engine's defaults, but for what a flag overrides; the functions inherit this process's
  // environment, and the stack's sweeper (in this process) reads it too.
  for (const [name, value] of Object.entries(options.engineEnv)) process.env[name] = value;
  let engine: EngineOptions;
  try {
    engine = engineOptionsFromEnv(process.env);
  } catch (error) {
    console.error(`kill-all-once: the engine settings are refused: ${message(error)}`);
    return 2;
  }
  const engineEnv = engineEnvironment(process.env);
  const scratch = await mkdtemp(join(tmpdir(), 'phaseline-kill-all-'));
  const toolExecutionLog = join(scratch, 'tool-executions.jsonl');
  const offline = { latencyMs: options.latencyMs, toolExecutionLog };
  const offlineSeed = String(new Rng(`${options.seed}/offline`).int(1, 1_000_000_000));
  const functionsEnv: Record<string, string> = {
    ...engineEnv,
    PHASELINE_PROVIDER: 'offline',
    PHASELINE_OFFLINE_SEED: offlineSeed,
    PHASELINE_OFFLINE_SETTINGS: JSON.stringify(offline),
  };
  const settingsLines = [
    `engine variables given to the functions and the sweeper: ${Object.keys(engineEnv).length === 0 ? 'none (every engine default)' : Object.entries(engineEnv).map(([name, value]) => `${name}=${value}`).join(' ')}`,
    `engine options in force: ${optionsText(engine)}`,
    `provider: PHASELINE_PROVIDER=offline PHASELINE_OFFLINE_SEED=${offlineSeed} PHASELINE_OFFLINE_SETTINGS=${JSON.stringify({ latencyMs: options.latencyMs })} (plus the toolbox's execution log, for the tool-call check)`,
    `stack: firebase.json ports; runJobStep's task queue as declared (Cloud Tasks redelivers by its backoff): ${JSON.stringify(runJobStep.__endpoint.taskQueueTrigger?.retryConfig ?? null)}; the stack's sweeper as deployed (a run every ${SWEEP_EVERY_MS / 1000} s, recovery passes every PHASELINE_SWEEP_INTERVAL_SECONDS within it)`,
    `job: research ${JSON.stringify(KILL_ALL_INPUT)}, offline model latency ${options.latencyMs} ms a call; allowance ${options.allowanceSeconds} s; seed ${options.seed}`,
  ];
  log(`kill-all-once: every function worker SIGKILLed once, mid-job`);
  for (const line of settingsLines) log(line);

  // firebase-tools gives a new function worker 30 s to start; on a loaded 2-core machine a cold start can take longer.
  process.env.FUNCTIONS_DISCOVERY_TIMEOUT ??= '120';
  const handle = startLocalStack({ page: false, echoEmulatorOutput: 'none', functionsEnv, log: (line) => log(`stack: ${line}`) });
  let app: App | null = null;
  let toolWatch: ToolResultWatch | null = null;
  const stopEverything = async (): Promise<void> => {
    toolWatch?.stop();
    toolWatch = null;
    if (app) await deleteApp(app).catch(() => undefined);
    app = null;
    await handle.stop();
  };
  const removeSignalHandlers = stopOnSignals(stopEverything, log);
  const onUnexpected = (error: unknown): void => {
    log(`the run failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
    void stopEverything().finally(() => process.exit(2));
  };
  process.on('unhandledRejection', onUnexpected);
  let keepScratch = false;
  try {
    let stack: LocalStack;
    try {
      stack = await handle.ready;
    } catch (error) {
      log(`the stack did not start: ${message(error)}`);
      return 2;
    }
    log(`stack ready: functions at ${stack.config.functionsBaseUrl}, Firestore at ${stack.config.firestoreHost}:${stack.config.firestorePort}`);
    const started = stackProcesses(await listProcesses(), process.pid);
    const stackPids = [started.firebase, started.firestore].filter((row): row is ProcessRow => row !== null);
    const died: { reason: string | null } = { reason: null };
    void stack.died.then((reason) => {
      died.reason = reason;
    });
    app = initializeApp({ projectId: stack.projectId, serviceAccountId: `${stack.projectId}@appspot.gserviceaccount.com` }, `phaseline-kill-all-${process.pid}`);
    const db: Firestore = getFirestore(app);
    const activeToolWatch = watchToolResults(db, log);
    toolWatch = activeToolWatch;
    const user = await signUp(stack.config);
    const submissions: Submission[] = [];

    /**
     * Submits one job over HTTP and watches its document until it ends; `onPoll` sees each read of
     * a running job (the faulted run kills from there).
     */
    const runJob = async (
      label: string,
      input: Readonly<Record<string, unknown>>,
      limitMs: number,
      onPoll?: (jobId: string, data: Readonly<Record<string, unknown>>, submittedAtMs: number) => Promise<void>,
    ): Promise<JobRun> => {
      const idempotencyKey = `kill-all-${options.seed}-${launchMs}-${label}`;
      const submittedAtMs = Date.now();
      const answer = await submit(stack.config, user, { pipeline: 'research', input, idempotencyKey }, { giveUpAfterMs: 120_000, timeoutMs: 30_000 });
      const jobId = answer.taskId;
      submissions.push({ index: submissions.length, pipeline: 'research', idempotencyKey, taskIds: [jobId], failure: null });
      log(`${label}: submitted job ${jobId} (${seconds(Date.now() - submittedAtMs)} to the 202)`);
      let status = 'queued';
      let outcome: string | null = null;
      let seenEndMs: number | null = null;
      let lastPhase: string | null = null;
      while (Date.now() < submittedAtMs + limitMs && died.reason === null) {
        const snapshot = await db.doc(`jobs/${jobId}`).get().catch(() => null);
        const data = snapshot?.data();
        if (data) {
          status = String(data.status);
          outcome = typeof data.outcome === 'string' ? data.outcome : null;
          const phase = typeof data.phase === 'string' ? data.phase : null;
          if (phase !== lastPhase) {
            log(`${label}: ${status}, phase ${phase ?? '(none)'} at ${seconds(Date.now() - submittedAtMs)}`);
            lastPhase = phase;
          }
          if (TERMINAL.has(status) || (status === 'waiting' && (data.waiting as { reason?: unknown } | null)?.reason === 'decision')) {
            seenEndMs = Date.now();
            break;
          }
          if (onPoll && status === 'running') await onPoll(jobId, data, submittedAtMs);
        }
        await sleep(POLL_MS);
      }
      // The end as committed: the terminal event's commit time (written in the same commit as the status).
      let endedAtMs = seenEndMs;
      if (seenEndMs !== null) {
        const events = await db.collection(`jobs/${jobId}/events`).where('kind', '==', status).get().catch(() => null);
        const commits = (events?.docs ?? []).map((doc) => doc.updateTime.toMillis());
        if (commits.length > 0) endedAtMs = Math.min(...commits);
      }
      const wallMs = endedAtMs === null ? null : endedAtMs - submittedAtMs;
      log(`${label}: job ${jobId} ${status}${outcome === null ? '' : ` (${outcome})`}${wallMs === null ? ` — not finished after ${seconds(limitMs)}` : ` in ${seconds(wallMs)} from submit`}`);
      return { label, jobId, submittedAtMs, endedAtMs, status, outcome, wallMs, load: loadavg()[0] ?? 0 };
    };

    if (options.warmUp) await runJob('warm-up', { question: `How do leases keep stale workers from corrupting results? (kill-all warm-up, seed ${options.seed})`, ...WARM_UP_INPUT }, JOB_LIMIT_MS);
    const baseline = await runJob(
      'fault-free',
      { question: `How should a long computation be checkpointed so that a crash loses little work? (kill-all fault-free run, seed ${options.seed})`, ...KILL_ALL_INPUT },
      JOB_LIMIT_MS,
    );
    if (baseline.wallMs === null || baseline.status !== 'completed') {
      log(`the fault-free job did not complete (${baseline.status}): no baseline to compare with`);
      await stopEverything();
      return 2;
    }

    let kill: KillRecord | null = null;
    const faulted = await runJob(
      'faulted',
      { question: `How do fencing tokens keep a reclaimed job from being written by its old worker? (kill-all faulted run, seed ${options.seed})`, ...KILL_ALL_INPUT },
      baseline.wallMs + JOB_LIMIT_MS,
      async (jobId, data, submittedAtMs) => {
        if (kill !== null) return;
        const fanout = data.fanout as { phase?: unknown } | null | undefined;
        const phase = typeof data.phase === 'string' ? data.phase : '';
        if (phase !== EXPERT_PHASE && fanout?.phase !== EXPERT_PHASE) return;
        const sections = await db.collection(`jobs/${jobId}/sections`).count().get();
        const recorded = sections.data().count;
        if (recorded < 1) return;
        // A step in flight in one of this stack's workers: the kill lands mid-work.
        const workers = new Set(stackProcesses(await listProcesses(), process.pid).workers.map((row) => row.pid));
        const holders = (await leaseHolders(db)).filter((holder) => holder.jobId === jobId && workers.has(workerPid(holder.worker) ?? -1));
        if (holders.length === 0) return;
        const atMs = Date.now();
        const { killed, gone } = await killAllWorkers();
        kill = { atMs, load: loadavg()[0] ?? 0, killed, gone, holders, sectionsBefore: recorded, phase: fanout?.phase === EXPERT_PHASE ? `${EXPERT_PHASE} (fan-out)` : phase };
        log(
          `faulted: SIGKILL to all ${killed.length} function worker processes (pids ${killed.map((row) => row.pid).join(', ')}) at ${seconds(atMs - submittedAtMs)} after submit ` +
            `— ${recorded} sections recorded; steps in flight: ${holders.map((holder) => `${holder.unit === null ? 'job' : `unit ${holder.unit}`} (epoch ${holder.epoch}, pid ${workerPid(holder.worker)})`).join(', ')}; ` +
            `${gone} of ${killed.length} gone within ${seconds(Date.now() - atMs)}`,
        );
      },
    );
    const record = kill as KillRecord | null;

    // ---- What happened: results, timeline, invariants ----
    const workersAfter = stackProcesses(await listProcesses(), process.pid).workers;
    const killedPids = new Set((record?.killed ?? []).map((row) => row.pid));
    const newWorkers = workersAfter.filter((row) => !killedPids.has(row.pid)).length;
    // Late writes of the killed steps cannot come (their processes are gone); a second for the last commits to settle.
    await sleep(1_000);
    const jobs = await collectJobs(db);
    const faultedJob = jobs.find((job) => job.id === faulted.jobId);
    const baselineJob = jobs.find((job) => job.id === baseline.jobId);
    const faultedResults = faultedJob?.results.length ?? 0;
    const baselineResults = baselineJob?.results.length ?? 0;
    const events = (await db.collection(`jobs/${faulted.jobId}/events`).get()).docs.map((doc) => ({
      kind: String(doc.get('kind')),
      message: String(doc.get('message') ?? ''),
      unit: typeof doc.get('unit') === 'string' ? String(doc.get('unit')) : null,
      atMs: doc.updateTime.toMillis(),
    }));
    const afterKill = record === null ? [] : events.filter((event) => event.atMs >= record.atMs).sort((a, b) => a.atMs - b.atMs);
    const reclaims = afterKill.filter((event) => event.kind === 'reclaimed');
    const takeovers = reclaims.filter((event) => /redelivered task took over/.test(event.message));
    const sweeperReclaims = reclaims.length - takeovers.length;
    const firstTakeover = takeovers[0];
    const lastTakeover = takeovers.at(-1);
    activeToolWatch.stop();
    const toolLog = await readToolExecutions(toolExecutionLog);
    const check = checkInvariants({ jobs, submissions, receiver: { applications: [], requests: [] }, toolResultsSeen: activeToolWatch.seen(), toolExecutions: toolLog.executions });
    const steps = await stepOutcomes(stack.logFile);

    log('stopping the stack…');
    await stopEverything();
    const runProblems = await leftovers(stackPids, null, log);

    // ---- The report ----
    const rule = '─'.repeat(78);
    const lines: string[] = [rule, `Phaseline chaos · kill-all-once · seed ${options.seed}`, rule, ...settingsLines, ''];
    const failures: string[] = [];
    lines.push(`fault-free job ${baseline.jobId}: ${baseline.status} (${baseline.outcome ?? '-'}) in ${seconds(baseline.wallMs)}, ${baselineResults} published result(s) (machine load ${baseline.load.toFixed(1)} at its end)`);
    if (record === null) {
      lines.push(`faulted job ${faulted.jobId}: ${faulted.status}; it was never seen mid-job with a step in flight, so no worker was killed`);
      console.log(`\n${lines.join('\n')}\n${rule}`);
      keepScratch = true;
      return 2;
    }
    lines.push(
      `faulted job ${faulted.jobId}: ${faulted.status} (${faulted.outcome ?? '-'})${faulted.wallMs === null ? ' — did not finish' : ` in ${seconds(faulted.wallMs)}`}, ${faultedResults} published result(s) (machine load ${faulted.load.toFixed(1)} at its end)`,
      `  killed: all ${record.killed.length} function worker processes at once (SIGKILL, ${record.gone} confirmed gone), ${seconds(record.atMs - faulted.submittedAtMs)} after submit ` +
        `(machine load ${record.load.toFixed(1)} on ${availableParallelism()} cores), ` +
        `in ${record.phase} with ${record.sectionsBefore} sections recorded; steps in flight then: ${record.holders.length} (${record.holders.map((holder) => (holder.unit === null ? 'job' : `unit ${holder.unit}`)).join(', ')})`,
      `  recovery: ${takeovers.length} take-overs by redelivered tasks (first ${firstTakeover ? seconds(firstTakeover.atMs - record.atMs) : '-'}, last ${lastTakeover ? seconds(lastTakeover.atMs - record.atMs) : '-'} after the kill), ` +
        `${sweeperReclaims} reclaims by the sweeper; ${newWorkers} new function workers running at the end; job staleReclaims now ${faultedJob?.job.staleReclaims ?? '?'}`,
    );
    for (const event of reclaims) lines.push(`    +${seconds(event.atMs - record.atMs)} ${event.unit === null ? 'job' : `unit ${event.unit}`}: ${event.message}`);
    if (faulted.wallMs !== null) {
      const differenceMs = faulted.wallMs - baseline.wallMs;
      const limitMs = baseline.wallMs + options.allowanceSeconds * 1000;
      lines.push(
        `difference: faulted ${seconds(faulted.wallMs)} − fault-free ${seconds(baseline.wallMs)} = ${differenceMs >= 0 ? '+' : ''}${seconds(differenceMs)} ` +
          `(target: at most +${options.allowanceSeconds} s, i.e. ${seconds(limitMs)}): ${faulted.wallMs <= limitMs ? 'met' : 'MISSED'}`,
      );
      if (faulted.wallMs > limitMs) failures.push(`the faulted job took ${seconds(differenceMs)} longer than the fault-free one (allowed: ${options.allowanceSeconds} s)`);
    }
    if (faulted.status !== 'completed') failures.push(`the faulted job did not complete: ${faulted.status}${faulted.wallMs === null ? ' (still not finished)' : ''}`);
    if (faultedResults !== 1) failures.push(`the faulted job published ${faultedResults} results (exactly one expected)`);
    if (takeovers.length === 0) failures.push('no redelivered task took a step over: the recovery was not the one this check is about');
    const broken = check.invariants.filter((invariant) => invariant.violations.length > 0);
    lines.push(
      `soak invariants over the ${jobs.length} jobs: ${broken.length === 0 ? `all ${check.invariants.length} at 0` : broken.map((invariant) => `${invariant.label} ${invariant.violations.length}`).join(', ')}` +
        ` (sections recomputed ${check.stats.sectionsRecomputed} of ${check.stats.sectionsTotal}; tool runs logged ${check.stats.toolExecutions}, IDs run twice+ ${check.stats.toolCallsRunMoreThanOnce})`,
    );
    for (const invariant of broken) {
      failures.push(`invariant broken: ${invariant.label}`);
      for (const violation of invariant.violations.slice(0, 10)) lines.push(`    ${invariant.label}: ${violation.jobId ?? '-'} ${violation.detail}`);
    }
    lines.push(`step outcomes in the functions' log: ${[...steps].map(([kind, count]) => `${kind} ${count}`).join(', ') || 'none found'}`);
    for (const problem of runProblems) failures.push(`run problem: ${problem}`);
    lines.push(failures.length === 0 ? 'PASS' : `FAIL: ${failures.join('; ')}`);
    console.log(`\n${lines.join('\n')}\n${rule}`);
    keepScratch = failures.length > 0;
    if (keepScratch) console.log(`The offline toolbox's execution log is kept at ${toolExecutionLog}; the functions' log at ${stack.logFile}`);
    return failures.length === 0 ? 0 : 1;
  } finally {
    await stopEverything().catch(() => undefined);
    if (!keepScratch) await rm(scratch, { recursive: true, force: true }).catch(() => undefined);
    removeSignalHandlers();
    process.removeListener('unhandledRejection', onUnexpected);
  }
}
