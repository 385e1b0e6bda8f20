/**
 * Phaseline as the bench runs it: the real runner and sweeper on the Firestore emulator, driven
 * in-process the way test/support/engine.ts drives them, with three differences: tasks that are
 * due run concurrently (as Cloud Tasks dispatches them), a worker a fault killed or froze is
 * abandoned where it stands, and when nothing can run the injected clock jumps to the next thing
 * that would happen in production (a backoff ending, or the first sweep after a lease expired,
 * sweeps falling on whole minutes as the every-minute schedule does). Jumps cost no real time;
 * they are added up as the job's virtual recovery wait.
 */
import { ManualClock, seededRandom } from '../../functions/src/core/clock';
import { stepTaskId, TERMINAL_STATUSES, type StepTask } from '../../functions/src/core/job';
import type { EngineOptions } from '../../functions/src/core/options';
import type { PipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep, type RunnerDeps, type StepOutcome } from '../../functions/src/engine/runner';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob, decodeUnit } from '../../functions/src/store/codec';
import { JobStore } from '../../functions/src/store/job-store';
import { jobPath } from '../../functions/src/store/paths';
import type { TaskQueuePort } from '../../functions/src/store/task-queue';
import { liveWorkerTimers, newWorker, runAsWorker } from './faults';
import type { ProjectClients } from './firestore';

const MINUTE_MS = 60_000;
/** Cloud Tasks redelivers a task whose handler threw; the bench waits this long (virtually) first. */
const REDELIVERY_DELAY_MS = 2_000;

interface QueuedTask {
  readonly id: string;
  readonly task: StepTask;
  readonly dueAtMs: number;
}

/** A task queue port on the injected clock that, like Cloud Tasks, drops a task ID it has seen. */
export class VirtualTaskQueue implements TaskQueuePort {
  readonly pending: QueuedTask[] = [];
  duplicates = 0;
  private readonly seen = new Set<string>();

  constructor(private readonly clock: ManualClock) {}

  enqueue(task: StepTask, options: { readonly id: string; readonly delaySeconds?: number }): Promise<void> {
    if (this.seen.has(options.id)) {
      this.duplicates += 1;
      return Promise.resolve();
    }
    this.seen.add(options.id);
    this.pending.push({ id: options.id, task, dueAtMs: this.clock.now() + (options.delaySeconds ?? 0) * 1000 });
    return Promise.resolve();
  }

  redeliver(queued: QueuedTask, delayMs: number): void {
    this.pending.push({ ...queued, dueAtMs: this.clock.now() + delayMs });
  }

  takeDue(nowMs: number): QueuedTask | undefined {
    const index = this.pending.findIndex((queued) => queued.dueAtMs <= nowMs);
    return index === -1 ? undefined : this.pending.splice(index, 1)[0];
  }

  nextDueMs(): number | undefined {
    return this.pending.length === 0 ? undefined : Math.min(...this.pending.map((queued) => queued.dueAtMs));
  }
}

export interface PhaselineJobRun {
  readonly jobId: string;
  readonly status: string;
  readonly outcome: string | null;
  /** Real time from submission to the job's terminal state. */
  readonly wallMs: number;
  /** Injected-clock time the driver jumped over: backoff, lease expiry, waiting for a sweep. */
  readonly virtualWaitMs: number;
  /** The same, by cause. */
  readonly waits: Readonly<Record<string, number>>;
  readonly tasks: number;
  readonly sweeps: number;
  readonly reclaimed: number;
  readonly taskErrors: number;
  readonly workersLost: number;
  readonly outcomes: Readonly<Record<string, number>>;
  /** What frozen workers did when they woke after the job had finished. */
  readonly zombieOutcomes: readonly string[];
}

export interface DriverHooks {
  /** Wakes workers frozen by a stall fault; called once the job is terminal. */
  wakeFrozen?(): number;
}

export class PhaselineDriver {
  readonly clock = new ManualClock();
  readonly queue: VirtualTaskQueue;
  readonly store: JobStore;
  private workerSequence = 0;

  constructor(
    private readonly project: ProjectClients,
    readonly options: EngineOptions,
    private readonly concurrency = 4,
  ) {
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
    let tasks = 0;
    let sweeps = 0;
    let reclaimed = 0;
    let taskErrors = 0;
    let workersLost = 0;
    let virtualWaitMs = 0;
    const waits: Record<string, number> = {};
    const wait = (cause: string, ms: number): void => {
      virtualWaitMs += ms;
      waits[cause] = (waits[cause] ?? 0) + ms;
    };
    let finishedAt: number | undefined;

    const start = (queued: QueuedTask): void => {
      tasks += 1;
      this.workerSequence += 1;
      const worker = newWorker(`bench-worker-${this.workerSequence}`);
      const work = runAsWorker(worker, () => runStep(this.deps(pipelines, worker.name), queued.task));
      const settled = work.then(
        (outcome) => ({ kind: 'outcome' as const, outcome }),
        (error: unknown) => ({ kind: 'error' as const, error }),
      );
      const done = Promise.race([settled, worker.down.then((kind) => ({ kind }))]).then((result) => {
        switch (result.kind) {
          case 'outcome':
            outcomes[result.outcome.kind] = (outcomes[result.outcome.kind] ?? 0) + 1;
            if (queued.task.jobId === jobId && (result.outcome.kind === 'completed' || result.outcome.kind === 'failed')) finishedAt ??= performance.now();
            return;
          case 'error':
            // A handler that throws gets its task redelivered by Cloud Tasks.
            taskErrors += 1;
            this.queue.redeliver(queued, REDELIVERY_DELAY_MS);
            return;
          case 'stall':
            workersLost += 1;
            zombies.push(settled.then((late) => (late.kind === 'outcome' ? late.outcome : 'error')));
            return;
          case 'crash':
            workersLost += 1;
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
      const nextDue = this.queue.nextDueMs();
      if (nextDue !== undefined) {
        wait('backoff before a retry', this.advanceTo(nextDue));
        continue;
      }
      const state = await this.inspect(jobId);
      if (state.terminal) {
        finishedAt ??= performance.now();
        break;
      }
      if (state.nextEventMs === null) throw new Error(`Job ${jobId} is ${state.status} with nothing queued, running or due: the bench driver is stuck`);
      // Nothing runs: the next thing that happens is the first sweep after the next lease expiry or wait.
      const sweepAt = Math.ceil((Math.max(state.nextEventMs, this.clock.now()) + 1) / MINUTE_MS) * MINUTE_MS;
      wait('lease expiry, then the next sweep', this.advanceTo(sweepAt));
      const report = await sweep({ store: this.store, queue: this.queue, log: () => undefined }, this.clock.now());
      sweeps += 1;
      reclaimed += report.reclaimed + report.unitsReclaimed;
    }
    const wallMs = (finishedAt ?? performance.now()) - startedAt;

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
      sweeps,
      reclaimed,
      taskErrors,
      workersLost,
      outcomes,
      zombieOutcomes,
    };
  }

  private advanceTo(ms: number): number {
    const delta = Math.max(0, ms - this.clock.now());
    this.clock.advance(delta);
    return delta;
  }

  /** Where the job stands, read on the uncounted client: terminal, or when something will next be due. */
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
