/**
 * Phaseline as the bench runs it: the real runner and sweeper on the Firestore emulator, driven
 * in-process the way test/support/engine.ts drives them, with the platform around them modelled
 * on an injected clock:
 *
 * - tasks that are due run concurrently (as Cloud Tasks dispatches them);
 * - a task whose delivery fails is delivered again on the step queue's retry schedule (read from
 *   runJobStep's own settings: 2 s, 4 s, 8 s, ... after each failure, at most maxAttempts
 *   deliveries). A delivery fails when the handler throws, when runStep answers `not-yet-due`
 *   for longer than the trigger waits in its request (runStepWhenDue: it waits up to
 *   dueWaitLimitMs in all and tries the claim again, then throws to be redelivered:
 *   functions/src/triggers/run-job-step.ts), when the worker is killed (the platform answers 5xx
 *   at once), and when the worker froze (the request fails only at the function timeout);
 * - a killed or frozen worker is abandoned where it stands: it neither heartbeats nor flushes;
 * - when nothing can run, the clock jumps to whichever comes first: the next task due, or the first
 *   sweeper pass after a lease expires or a queued job's grace runs out (a full sweep each minute,
 *   recovery passes every sweepIntervalSeconds between them, as the deployed sweepJobs runs).
 *
 * So a killed worker's task comes back within seconds and takes the job (or unit) over once the
 * dead worker's heartbeat is `staleHeartbeatSeconds` old; the sweeper reclaims what no task comes
 * back for. `killedTasks: 'lost'` drops a killed worker's task instead (no redelivery at all):
 * recovery is then the sweeper's alone, as it was before redelivered tasks could take over.
 * Jumps cost no real time; they are added up as the job's virtual wait, by cause.
 */
import { ManualClock, seededRandom } from '../../functions/src/core/clock';
import { stepTaskId, TERMINAL_STATUSES, type StepTask } from '../../functions/src/core/job';
import type { EngineOptions } from '../../functions/src/core/options';
import type { PipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import { afterDueWait, decideDueWait, DUE_WAIT_START, dueWaitLimitMs, type DueWaitState } from '../../functions/src/engine/step/due-wait';
import type { RunnerDeps, StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep, sweepRecovery } from '../../functions/src/engine/sweeper';
import { decodeJob, decodeUnit } from '../../functions/src/store/codec';
import { JobStore } from '../../functions/src/store/job-store';
import { jobPath } from '../../functions/src/store/paths';
import type { TaskQueuePort } from '../../functions/src/store/task-queue';
import { nextSweepPass, redeliveryDelayMs, STEP_QUEUE } from './cloud-tasks';
import { liveWorkerTimers, newWorker, runAsWorker } from './faults';
import type { ProjectClients } from './firestore';

/** Causes of virtual wait, as the report names them. */
export const WAIT = {
  backoff: 'backoff before a retry',
  killed: 'killed worker: redeliveries until its heartbeat is stale',
  frozen: 'frozen worker: function timeout, then redelivery',
  error: 'error: redelivery',
  early: 'task came early: redelivery',
  dueWait: 'task came early: waited in its request',
  sweep: 'lease expiry, then the next sweep',
} as const;

interface QueuedTask {
  readonly id: string;
  readonly task: StepTask;
  readonly dueAtMs: number;
  /** Deliveries of this task that failed so far (Cloud Tasks' retry count). */
  readonly failures: number;
  /** What the virtual wait before this delivery is counted as. */
  readonly cause: string;
  /** Set when this run is the same delivery trying its claim again after waiting in its request (runStepWhenDue's state). */
  readonly dueWait?: DueWaitState;
}

/** A task queue port on the injected clock that, like Cloud Tasks, drops a task ID it has seen. */
export class VirtualTaskQueue implements TaskQueuePort {
  readonly pending: QueuedTask[] = [];
  duplicates = 0;
  /** Tasks dropped after their last allowed delivery failed. */
  dropped = 0;
  private readonly seen = new Set<string>();

  constructor(private readonly clock: ManualClock) {}

  enqueue(task: StepTask, options: { readonly id: string; readonly delaySeconds?: number }): Promise<void> {
    if (this.seen.has(options.id)) {
      this.duplicates += 1;
      return Promise.resolve();
    }
    this.seen.add(options.id);
    this.pending.push({ id: options.id, task, dueAtMs: this.clock.now() + (options.delaySeconds ?? 0) * 1000, failures: 0, cause: WAIT.backoff });
    return Promise.resolve();
  }

  /**
   * A delivery failed `afterMs` from now (0: at once): Cloud Tasks delivers the task again after
   * its backoff, unless that was the last delivery allowed. Returns whether it will come back.
   */
  redeliver(queued: QueuedTask, cause: string, afterMs = 0): boolean {
    const failures = queued.failures + 1;
    if (failures >= STEP_QUEUE.maxAttempts) {
      this.dropped += 1;
      return false;
    }
    this.pending.push({ ...queued, failures, cause, dueAtMs: this.clock.now() + afterMs + redeliveryDelayMs(failures) });
    return true;
  }

  /** The same delivery tries its claim again `afterMs` from now, after waiting in its request (no failure counted; a redelivery keeps the cause it came back for). */
  waitInRequest(queued: QueuedTask, afterMs: number, dueWait: DueWaitState): void {
    this.pending.push({ ...queued, cause: queued.failures > 0 ? queued.cause : WAIT.dueWait, dueWait, dueAtMs: this.clock.now() + afterMs });
  }

  takeDue(nowMs: number): QueuedTask | undefined {
    const index = this.pending.findIndex((queued) => queued.dueAtMs <= nowMs);
    return index === -1 ? undefined : this.pending.splice(index, 1)[0];
  }

  /** The task due first, if any. */
  next(): QueuedTask | undefined {
    let first: QueuedTask | undefined;
    for (const queued of this.pending) if (first === undefined || queued.dueAtMs < first.dueAtMs) first = queued;
    return first;
  }

  /** Forgets a finished job's tasks still waiting (a frozen worker's redelivery after the job ended). */
  discardJob(jobId: string): number {
    const before = this.pending.length;
    const kept = this.pending.filter((queued) => queued.task.jobId !== jobId);
    this.pending.splice(0, this.pending.length, ...kept);
    return before - kept.length;
  }
}

/** A worker a fault took, and how long its job or unit waited until someone else held it. */
export interface Recovery {
  readonly fault: 'crash' | 'stall';
  /** The unit the worker held, or null for the job itself. */
  readonly unit: string | null;
  readonly lostAtMs: number;
  /** Virtual time from the loss to the reclaim (a redelivered task's takeover or the sweeper's); null if never reclaimed. */
  readonly waitMs: number | null;
  /** Who reclaimed it, from the reclaim event's message. */
  readonly by: 'redelivered task' | 'sweeper' | null;
}

export interface PhaselineJobRun {
  readonly jobId: string;
  readonly status: string;
  readonly outcome: string | null;
  /** Real time from submission to the job's terminal state. */
  readonly wallMs: number;
  /** Injected-clock time the driver jumped over: backoff, redeliveries, lease expiry, waiting for a sweep. */
  readonly virtualWaitMs: number;
  /** The same, by cause (see WAIT). */
  readonly waits: Readonly<Record<string, number>>;
  /** Task deliveries, redeliveries included: what the queue dispatched for this job. */
  readonly tasks: number;
  /** Real time the job's tasks ran, added over tasks (parallel ones each count): function-seconds. */
  readonly taskMs: number;
  readonly sweeps: number;
  readonly reclaimed: number;
  readonly taskErrors: number;
  /** Deliveries that failed because runStep answered `not-yet-due` (the trigger throws then). */
  readonly notYetDue: number;
  readonly workersLost: number;
  readonly recoveries: readonly Recovery[];
  readonly outcomes: Readonly<Record<string, number>>;
  /** What frozen workers did when they woke after the job had finished. */
  readonly zombieOutcomes: readonly string[];
}

export interface DriverHooks {
  /** Wakes workers frozen by a stall fault; called once the job is terminal. */
  wakeFrozen?(): number;
}

export interface DriverSettings {
  /** Tasks running at once (4: the two experts in parallel, with room to spare). */
  readonly concurrency?: number;
  /**
   * What happens to the task of a killed worker: `redelivered` (Cloud Tasks retries the failed
   * request, as in production) or `lost` (it never comes back; only the sweeper recovers).
   */
  readonly killedTasks?: 'redelivered' | 'lost';
}

interface Loss {
  readonly fault: 'crash' | 'stall';
  readonly unit: string | null;
  readonly atMs: number;
}

export class PhaselineDriver {
  readonly clock = new ManualClock();
  readonly queue: VirtualTaskQueue;
  readonly store: JobStore;
  private readonly concurrency: number;
  private readonly killedTasks: 'redelivered' | 'lost';
  private workerSequence = 0;

  constructor(
    private readonly project: ProjectClients,
    readonly options: EngineOptions,
    settings: DriverSettings = {},
  ) {
    this.concurrency = settings.concurrency ?? 4;
    this.killedTasks = settings.killedTasks ?? 'redelivered';
    this.queue = new VirtualTaskQueue(this.clock);
    this.store = new JobStore(project.db, this.clock, options);
  }

  private deps(pipelines: PipelineRegistry, worker: string): RunnerDeps {
    return { store: this.store, queue: this.queue, pipelines, random: seededRandom(7), worker, timers: liveWorkerTimers };
  }

  async submit(pipeline: string, input: unknown, owner = 'bench-user'): Promise<string> {
    const created = await this.store.createJob({ owner, pipeline, input, conversationId: null, idempotencyKey: null });
    if (!('created' in created)) throw new Error('unexpected idempotency conflict');
    await this.queue.enqueue({ jobId: created.job.id, step: 0 }, { id: stepTaskId(created.job.id, 0, 0) });
    return created.job.id;
  }

  /** Submits one job and runs it to a terminal state. */
  async runJob(pipelines: PipelineRegistry, pipeline: string, input: unknown, hooks: DriverHooks = {}): Promise<PhaselineJobRun> {
    const startedAt = performance.now();
    const jobId = await this.submit(pipeline, input);
    return this.runUntilTerminal(pipelines, jobId, startedAt, hooks);
  }

  async runUntilTerminal(pipelines: PipelineRegistry, jobId: string, startedAt: number, hooks: DriverHooks = {}): Promise<PhaselineJobRun> {
    const running = new Set<Promise<void>>();
    const zombies: Promise<StepOutcome | 'error'>[] = [];
    const outcomes: Record<string, number> = {};
    const losses: Loss[] = [];
    const reclaimingSweeps = new Set<number>();
    let tasks = 0;
    let taskMs = 0;
    let sweeps = 0;
    let reclaimed = 0;
    let taskErrors = 0;
    let notYetDue = 0;
    let virtualWaitMs = 0;
    const waits: Record<string, number> = {};
    const wait = (cause: string, ms: number): void => {
      if (ms <= 0) return;
      virtualWaitMs += ms;
      waits[cause] = (waits[cause] ?? 0) + ms;
    };
    let finishedAt: number | undefined;
    // A failed delivery of a task that was itself a redelivery keeps the cause it was redelivered for.
    const causeAfter = (queued: QueuedTask, fallback: string): string => (queued.failures > 0 ? queued.cause : fallback);

    const start = (queued: QueuedTask): void => {
      // A claim tried again after a wait in the request is the same delivery.
      if (queued.dueWait === undefined) tasks += 1;
      this.workerSequence += 1;
      const worker = newWorker(`bench-worker-${this.workerSequence}`);
      const began = performance.now();
      const work = runAsWorker(worker, () => runStep(this.deps(pipelines, worker.name), queued.task));
      const settled = work.then(
        (outcome) => ({ kind: 'outcome' as const, outcome }),
        (error: unknown) => ({ kind: 'error' as const, error }),
      );
      const done = Promise.race([settled, worker.down.then((kind) => ({ kind }))]).then((result) => {
        taskMs += performance.now() - began;
        switch (result.kind) {
          case 'outcome':
            outcomes[result.outcome.kind] = (outcomes[result.outcome.kind] ?? 0) + 1;
            if (queued.task.jobId === jobId && (result.outcome.kind === 'completed' || result.outcome.kind === 'failed')) finishedAt ??= performance.now();
            if (result.outcome.kind === 'not-yet-due') {
              const { retryAfterMs } = result.outcome;
              // runJobStep waits in its request, acknowledges another worker's claim, or throws so that Cloud Tasks delivers the task again, by the same rule (runStepWhenDue).
              const state = queued.dueWait ?? DUE_WAIT_START;
              const decision = decideDueWait(state, retryAfterMs, this.store.options, dueWaitLimitMs(this.store.options));
              if (decision.action === 'acknowledge') return;
              if (decision.action === 'wait') {
                this.queue.waitInRequest(queued, decision.waitMs, afterDueWait(state, retryAfterMs, decision.waitMs));
                return;
              }
              notYetDue += 1;
              const { dueWait: _waited, ...delivery } = queued;
              this.queue.redeliver(delivery, causeAfter(queued, WAIT.early));
            }
            return;
          case 'error':
            // A handler that throws gets its task redelivered by Cloud Tasks.
            taskErrors += 1;
            this.queue.redeliver(queued, causeAfter(queued, WAIT.error));
            return;
          case 'stall':
            // The request hangs until the function times out; only then is the task retried.
            losses.push({ fault: 'stall', unit: queued.task.unit ?? null, atMs: this.clock.now() });
            zombies.push(settled.then((late) => (late.kind === 'outcome' ? late.outcome : 'error')));
            this.queue.redeliver(queued, WAIT.frozen, STEP_QUEUE.timeoutSeconds * 1000);
            return;
          case 'crash':
            // The platform answers the killed request with an error at once: Cloud Tasks retries it.
            losses.push({ fault: 'crash', unit: queued.task.unit ?? null, atMs: this.clock.now() });
            if (this.killedTasks === 'redelivered') this.queue.redeliver(queued, WAIT.killed);
            return;
        }
      });
      running.add(done);
      void done.finally(() => running.delete(done));
    };

    for (let round = 0; round < 10_000; round += 1) {
      while (running.size < this.concurrency) {
        const due = this.queue.takeDue(this.clock.now());
        if (!due) break;
        start(due);
      }
      if (running.size > 0) {
        await Promise.race(running);
        continue;
      }
      // Nothing runs and nothing is due now: the job is done, or the clock moves to what happens next.
      const state = await this.inspect(jobId);
      if (state.terminal) {
        finishedAt ??= performance.now();
        break;
      }
      const next = this.queue.next();
      // The first sweeper pass after the next lease expiry or lost-task grace: full sweeps on the schedule's period, recovery passes every sweepIntervalSeconds between them.
      const pass = state.nextEventMs === null ? undefined : nextSweepPass(Math.max(state.nextEventMs, this.clock.now()), this.store.options.sweepIntervalSeconds * 1000);
      const sweepAt = pass?.atMs;
      if (next !== undefined && (sweepAt === undefined || next.dueAtMs < sweepAt)) {
        wait(next.cause, this.advanceTo(next.dueAtMs));
        continue;
      }
      if (sweepAt === undefined) throw new Error(`Job ${jobId} is ${state.status} with nothing queued, running or due: the bench driver is stuck`);
      wait(WAIT.sweep, this.advanceTo(sweepAt));
      const sweepDeps = { store: this.store, queue: this.queue, log: () => undefined };
      const report = pass?.full === false ? await sweepRecovery(sweepDeps, this.clock.now()) : await sweep(sweepDeps, this.clock.now());
      sweeps += 1;
      reclaimed += report.reclaimed + report.unitsReclaimed;
      if (report.reclaimed + report.unitsReclaimed > 0) reclaimingSweeps.add(this.clock.now());
    }
    const wallMs = (finishedAt ?? performance.now()) - startedAt;
    // A frozen worker's redelivery after the job ended would be acknowledged (the job is terminal); it is not run.
    this.queue.discardJob(jobId);

    const zombieOutcomes: string[] = [];
    if (hooks.wakeFrozen?.()) {
      for (const late of await Promise.all(zombies)) zombieOutcomes.push(late === 'error' ? 'error' : late.kind);
    }
    const final = decodeJob(jobId, (await this.project.inspector.doc(jobPath(jobId)).get()).data());
    return {
      jobId,
      status: final.status,
      outcome: final.outcome,
      wallMs,
      virtualWaitMs,
      waits,
      tasks,
      taskMs,
      sweeps,
      reclaimed,
      taskErrors,
      notYetDue,
      workersLost: losses.length,
      recoveries: await this.recoveries(jobId, losses, reclaimingSweeps),
      outcomes,
      zombieOutcomes,
    };
  }

  private advanceTo(ms: number): number {
    const delta = Math.max(0, ms - this.clock.now());
    this.clock.advance(delta);
    return delta;
  }

  /**
   * For each lost worker, the first reclaim of what it held (its unit, or the job) at or after the
   * loss, from the job's timeline (`reclaimed` events carry the injected clock's time); a reclaim
   * at the time of a sweep that reclaimed something is the sweeper's.
   */
  private async recoveries(jobId: string, losses: readonly Loss[], reclaimingSweeps: ReadonlySet<number>): Promise<Recovery[]> {
    if (losses.length === 0) return [];
    const events = (await this.project.inspector.collection(`${jobPath(jobId)}/events`).where('kind', '==', 'reclaimed').get()).docs.map((doc) => ({
      unit: (doc.get('unit') as string | null | undefined) ?? null,
      atMs: Number(doc.get('atMs')),
    }));
    const used = new Set<number>();
    return losses.map((loss) => {
      let found: number | undefined;
      for (const [index, event] of events.entries()) {
        if (used.has(index) || event.unit !== loss.unit || !(event.atMs >= loss.atMs)) continue;
        if (found === undefined || event.atMs < (events[found] as { atMs: number }).atMs) found = index;
      }
      if (found === undefined) return { fault: loss.fault, unit: loss.unit, lostAtMs: loss.atMs, waitMs: null, by: null };
      used.add(found);
      const atMs = (events[found] as { atMs: number }).atMs;
      return { fault: loss.fault, unit: loss.unit, lostAtMs: loss.atMs, waitMs: atMs - loss.atMs, by: reclaimingSweeps.has(atMs) ? 'sweeper' : 'redelivered task' };
    });
  }

  /** Where the job stands, read on the uncounted client: terminal, or when the sweeper would next have something to do. */
  private async inspect(jobId: string): Promise<{ terminal: boolean; status: string; nextEventMs: number | null }> {
    const db = this.project.inspector;
    const job = decodeJob(jobId, (await db.doc(jobPath(jobId)).get()).data());
    if (TERMINAL_STATUSES.has(job.status)) return { terminal: true, status: job.status, nextEventMs: null };
    const grace = this.options.lostTaskGraceSeconds * 1000;
    const candidates: number[] = [];
    if (job.status === 'running' && job.lease) candidates.push(job.lease.expiresAtMs);
    if (job.status === 'waiting' && job.waiting?.untilMs != null) candidates.push(job.waiting.untilMs);
    if (job.status === 'queued') candidates.push(job.nextRunAtMs + grace);
    for (const doc of (await db.collection(`${jobPath(jobId)}/units`).get()).docs) {
      const unit = decodeUnit(doc.ref.path, doc.data());
      if (unit.status === 'running' && unit.lease) candidates.push(unit.lease.expiresAtMs);
      if (unit.status === 'queued' && job.fanout?.epoch === unit.fanoutEpoch) candidates.push(unit.nextRunAtMs + grace);
    }
    return { terminal: false, status: job.status, nextEventMs: candidates.length === 0 ? null : Math.min(...candidates) };
  }
}
