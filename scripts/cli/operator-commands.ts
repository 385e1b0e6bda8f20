/**
 * What an operator does, through the admin SDK and the engine's own functions: every job listed,
 * a quarantined job released, one sweep run, a user's limits shown or set. Locally the admin SDK talks to the emulators
 * (FIRESTORE_EMULATOR_HOST, CLOUD_TASKS_EMULATOR_HOST); against a deployed project it uses
 * Application Default Credentials.
 */
import { randomBytes } from 'node:crypto';
import { userInfo } from 'node:os';
import { deleteApp, initializeApp, type App } from 'firebase-admin/app';
import { getFirestore } from 'firebase-admin/firestore';
import { systemClock } from '../../functions/src/core/clock';
import { describeError, PhaselineError } from '../../functions/src/core/errors';
import type { QuotaDefaults, UserLimits } from '../../functions/src/core/quota';
import type { PipelineRegistry } from '../../functions/src/core/pipeline';
import { OperatorActionRefusedError, redriveJob, releaseQuarantined } from '../../functions/src/engine/operator';
import { sweep as runSweep } from '../../functions/src/engine/sweeper';
import { deployedPipelines } from '../../functions/src/pipelines';
import { notifyStoppedEffects } from '../../functions/src/pipelines/notify/config';
import { decodeJob } from '../../functions/src/store/codec';
import { cloudTasksQueue } from '../../functions/src/store/cloud-tasks-queue';
import { JobStore } from '../../functions/src/store/job-store';
import { JOBS, userLimitsPath } from '../../functions/src/store/paths';
import { readUserLimits, setUserLimits } from '../../functions/src/store/quota-documents';
import type { TaskQueuePort } from '../../functions/src/store/task-queue';
import { engineOptionsFromEnv } from '../../functions/src/triggers/config';
import type { Command } from './args';
import { CliError, connectionProblem, EXIT } from './errors';
import { jobTable, sweepReportLines, terminalText, type TimeOptions } from './format';
import type { Io } from './io';
import { describeTarget, ENV, type Target } from './target';
import { jobViewFromRecord, type JobView } from './views';

export interface OperatorContext {
  readonly target: Target;
  readonly io: Io;
  readonly store: JobStore;
  readonly queue: TaskQueuePort;
  /** "Now" for a sweep; the wall clock outside tests. */
  readonly now: () => number;
  readonly time: TimeOptions;
  /** The pipelines a re-drive names phases of; the deployed ones when absent (tests give their own). */
  readonly pipelines?: PipelineRegistry;
  close(): Promise<void>;
}

async function emulatorAnswers(host: string): Promise<string | null> {
  try {
    await fetch(`http://${host}/`, { signal: AbortSignal.timeout(3_000) });
    return null;
  } catch (error) {
    return connectionProblem(error);
  }
}

/**
 * The admin SDK on the target. Locally it first checks that the Firestore emulator answers (the
 * SDK would otherwise retry for minutes), and points this process's FIRESTORE_EMULATOR_HOST and
 * CLOUD_TASKS_EMULATOR_HOST at the local stack.
 */
export async function openOperatorContext(target: Target, io: Io, env: NodeJS.ProcessEnv = process.env): Promise<OperatorContext> {
  let app: App;
  const name = `phaseline-cli-${randomBytes(4).toString('hex')}`;
  if (target.kind === 'local') {
    const problem = await emulatorAnswers(target.hosts.firestore);
    if (problem !== null) {
      throw new CliError(`Could not reach the Firestore emulator at ${target.hosts.firestore} (${problem}). Is the local stack running? Start it with \`npm start\`.`);
    }
    process.env[ENV.firestoreEmulator] = target.hosts.firestore;
    process.env[ENV.tasksEmulator] = target.hosts.tasks;
    // Google's auth library otherwise probes the GCE metadata server (a non-loopback address) for
    // credentials the emulators do not need.
    process.env[ENV.metadataServerDetection] ??= 'none';
    // A service account ID spares the task enqueue a metadata-server probe under the emulator.
    app = initializeApp({ projectId: target.projectId, serviceAccountId: `${target.projectId}@appspot.gserviceaccount.com` }, name);
  } else {
    app = initializeApp({ projectId: target.projectId }, name);
  }
  const db = getFirestore(app);
  return {
    target,
    io,
    store: new JobStore(db, systemClock, engineOptionsFromEnv(env)),
    queue: cloudTasksQueue(app),
    now: () => Date.now(),
    time: {},
    close: async () => {
      await db.terminate();
      await deleteApp(app);
    },
  };
}

/** The engine's warnings as lines on stderr; their details (job IDs, errors) can quote stored text, so control characters are escaped. */
function warnings(io: Io): (message: string, detail?: Record<string, unknown>) => void {
  return (message, detail) => io.err(terminalText(`warning: ${message}${detail ? ` ${JSON.stringify(detail)}` : ''}`));
}

type ListCommand = Extract<Command, { name: 'list' }>;
type ReleaseCommand = Extract<Command, { name: 'release' }>;
type RedriveCommand = Extract<Command, { name: 'redrive' }>;
type LimitsCommand = Extract<Command, { name: 'limits' }>;

/** Every user's jobs, newest first (a single-field index: no composite index needed). */
export async function listAll(ctx: OperatorContext, command: ListCommand): Promise<number> {
  const snapshot = await ctx.store.db.collection(JOBS).orderBy('createdAt', 'desc').limit(command.limit).get();
  const jobs: JobView[] = [];
  for (const document of snapshot.docs) {
    try {
      jobs.push(jobViewFromRecord(decodeJob(document.id, document.data())));
    } catch (error) {
      ctx.io.err(terminalText(`Skipped job ${document.id}: ${describeError(error)}`));
    }
  }
  ctx.io.err(`Jobs of every user on ${describeTarget(ctx.target)}, newest first:`);
  for (const line of jobTable(jobs, { ...ctx.time, withOwner: true })) ctx.io.out(line);
  return EXIT.ok;
}

/** Sends a quarantined job back to the queue (the engine's releaseQuarantined); any other status is refused. */
export async function release(ctx: OperatorContext, command: ReleaseCommand): Promise<number> {
  let result;
  try {
    result = await releaseQuarantined(
      ctx.store,
      ctx.queue,
      command.jobId,
      ctx.now(),
      warnings(ctx.io),
      localOperatorName(),
    );
  } catch (error) {
    if (error instanceof OperatorActionRefusedError) throw new CliError(`Release refused: ${error.message}`);
    throw error;
  }
  ctx.io.out(`Released job ${command.jobId}: queued at step ${result.job.step}, attempts and stale reclaims reset to 0.`);
  ctx.io.out(
    result.enqueued
      ? `Task ${result.taskId} enqueued.`
      : `Its task ${result.taskId} could not be enqueued; the job stays queued and the sweeper dispatches it once the lost-task grace period has passed.`,
  );
  return EXIT.ok;
}

/** Who runs this CLI, for a re-drive's timeline when --by is not given. */
function localOperatorName(): string {
  try {
    return `${userInfo().username} (phaseline CLI)`;
  } catch {
    return 'an operator (phaseline CLI)';
  }
}

/** Runs a completed, failed or quarantined job again from a phase (the engine's redriveJob); refusals exit 1 with the reason. */
export async function redrive(ctx: OperatorContext, command: RedriveCommand): Promise<number> {
  const by = command.by ?? localOperatorName();
  let result;
  try {
    result = await redriveJob(
      ctx.store,
      ctx.queue,
      { jobId: command.jobId, fromPhase: command.fromPhase, by, reason: command.reason },
      ctx.now(),
      {
        // The engine is handed its registry: a re-drive reads the phase lists only, never a backend.
        pipelines: ctx.pipelines ?? deployedPipelines(() => ctx.store.db),
        log: warnings(ctx.io),
      },
    );
  } catch (error) {
    if (error instanceof OperatorActionRefusedError) throw new CliError(`Re-drive refused: ${error.message}`);
    throw error;
  }
  const resumes = result.resumesAt === command.fromPhase ? '' : ` (it resumes at ${result.resumesAt}, an earlier phase it never finished)`;
  ctx.io.out(`Re-drove job ${command.jobId} from ${command.fromPhase}${resumes}: queued at step ${result.job.step}, attempts and stale reclaims reset to 0.`);
  ctx.io.out(`Set aside for audit: ${result.setAside} documents, under jobs/${command.jobId}/setAside/${result.auditPrefix}…`);
  ctx.io.out(
    result.enqueued
      ? `Task ${result.taskId} enqueued.`
      : `Its task ${result.taskId} could not be enqueued; the job stays queued and the sweeper dispatches it once the lost-task grace period has passed.`,
  );
  return EXIT.ok;
}

/** One sweep, run here with the engine's sweep(); exits 1 when a query or a document failed. */
export async function sweep(ctx: OperatorContext): Promise<number> {
  const report = await runSweep(
    {
      store: ctx.store,
      queue: ctx.queue,
      log: warnings(ctx.io),
      // As the deployed sweepJobs: stopped notify jobs' effects are checked with PHASELINE_RECEIVER_URL's receiver.
      stoppedEffects: { settlerFor: notifyStoppedEffects() },
    },
    ctx.now(),
  );
  for (const line of sweepReportLines(report)) ctx.io.out(line);
  return report.errors > 0 || report.stoppedEffects.errors > 0 || report.retention.errors > 0 ? EXIT.failure : EXIT.ok;
}

const LIMIT_LABELS: Readonly<Record<keyof UserLimits, string>> = { jobsInFlight: 'jobs in flight', submitsPerMinute: 'submits per minute', spendUsdPerDay: 'USD per day' };

/**
 * Shows a user's limits, after setting or clearing the ones the command names. The defaults shown
 * are this process's quota settings (the functions' configuration variables); the functions apply their own.
 */
export async function limits(ctx: OperatorContext, command: LimitsCommand, defaults: QuotaDefaults): Promise<number> {
  const { db } = ctx.store;
  if (Object.keys(command.change).length > 0) {
    try {
      await setUserLimits(db, command.uid, command.change, ctx.now());
    } catch (error) {
      if (error instanceof PhaselineError && error.code === 'invalid_input') throw new CliError(error.message);
      throw error;
    }
  }
  const view = await readUserLimits(db, defaults, command.uid);
  ctx.io.out(`Limits of ${command.uid} (${userLimitsPath(command.uid)}${view.override === null ? ': none set, the defaults apply' : ''}):`);
  for (const [limit, label] of Object.entries(LIMIT_LABELS) as [keyof UserLimits, string][]) {
    const set = view.override?.[limit];
    const shown = set === undefined ? `default: ${defaults.signedIn[limit]} signed in, ${defaults.anonymous[limit]} anonymous` : `${set} (set by an operator)`;
    ctx.io.out(`  ${label.padEnd(20)}${shown}`);
  }
  ctx.io.err('The defaults shown come from the quota settings in this environment; the functions apply their own.');
  return EXIT.ok;
}
