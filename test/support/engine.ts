/** Wires the engine to the emulator with an injected clock, a recording task queue and silent timers. */
import { ManualClock, seededRandom } from '../../functions/src/core/clock';
import type { Timers } from '../../functions/src/core/flusher';
import { stepTaskId, type JobRecord } from '../../functions/src/core/job';
import { resolveEngineOptions, type EngineOptions } from '../../functions/src/core/options';
import type { PipelineRegistry } from '../../functions/src/core/pipeline';
import { DEFAULT_QUOTA_DEFAULTS, MAX_SPEND_USD_PER_DAY } from '../../functions/src/core/quota';
import { runStep } from '../../functions/src/engine/step';
import { sweep } from '../../functions/src/engine/sweeper';
import type { RunnerDeps, StepOutcome } from '../../functions/src/engine/step/deps';
import { SpendLedger } from '../../functions/src/store/quota-documents';
import { JobStore } from '../../functions/src/store/job-store';
import { decodeJob, encodeJob } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { openTestFirestore, type TestFirestore } from './firestore';
import { RecordingTaskQueue } from './task-queue';
import { resetBehaviour } from './test-pipeline';

/** Timers that never fire: heartbeats only happen when a test asks for them. */
export const stoppedTimers: Timers = { setTimeout: () => undefined, clearTimeout: () => undefined };

export interface EngineHarness {
  readonly firestore: TestFirestore;
  readonly clock: ManualClock;
  readonly queue: RecordingTaskQueue;
  readonly store: JobStore;
  readonly options: EngineOptions;
  /** The job document as the engine decodes it. */
  readJob(jobId: string): Promise<JobRecord>;
  /** The kinds of the job's events, oldest first. */
  eventKinds(jobId: string): Promise<string[]>;
  deps(worker?: string, overrides?: Partial<RunnerDeps>): RunnerDeps;
  submit(pipeline: string, input: unknown, owner?: string, conversationId?: string): Promise<string>;
  /**
   * Runs queued tasks one at a time (moving the clock past any delay): `maxTasks` of them, or
   * until none are left (failing if that never happens).
   */
  drain(maxTasks?: number): Promise<StepOutcome[]>;
}

export function engineHarness(
  label: string,
  pipelinesOrFactory: PipelineRegistry | ((firestore: TestFirestore, clock: ManualClock) => PipelineRegistry),
  overrides: Partial<EngineOptions> = {},
): EngineHarness {
  const firestore = openTestFirestore(label);
  const clock = new ManualClock();
  const pipelines = typeof pipelinesOrFactory === 'function' ? pipelinesOrFactory(firestore, clock) : pipelinesOrFactory;
  const queue = new RecordingTaskQueue();
  const options = resolveEngineOptions({ backoffBaseSeconds: 1, backoffMaxSeconds: 10, ...overrides });
  const store = new JobStore(firestore.db, clock, options, queue);
  const random = seededRandom(7);
  // The simulated prices of these tests are far above real ones: no default daily cap applies here. spend-cap.test.ts sets caps per user.
  const uncapped = { spendUsdPerDay: MAX_SPEND_USD_PER_DAY };
  const spendLedger = new SpendLedger(firestore.db, { signedIn: { ...DEFAULT_QUOTA_DEFAULTS.signedIn, ...uncapped }, anonymous: { ...DEFAULT_QUOTA_DEFAULTS.anonymous, ...uncapped } });
  const harness: EngineHarness = {
    firestore,
    clock,
    queue,
    store,
    options,
    readJob: async (jobId) => decodeJob(jobId, (await firestore.db.doc(`${JOBS}/${jobId}`).get()).data()),
    eventKinds: async (jobId) => (await firestore.db.collection(`${JOBS}/${jobId}/events`).orderBy('atMs').get()).docs.map((doc) => doc.get('kind') as string),
    deps: (worker = 'worker-a', extra = {}) => ({ store, queue, pipelines, random, worker, timers: stoppedTimers, spendLedger, ...extra }),
    async submit(pipeline, input, owner = 'user-1', conversationId) {
      const created = await store.createJob({ owner, pipeline, input, conversationId: conversationId ?? null, idempotencyKey: null });
      if (!('created' in created)) throw new Error('unexpected idempotency conflict');
      await queue.enqueue({ jobId: created.job.id, step: 0 }, { id: stepTaskId(created.job.id, 0, 0) });
      return created.job.id;
    },
    async drain(maxTasks) {
      const outcomes: StepOutcome[] = [];
      const limit = maxTasks ?? 500;
      for (let round = 0; round < limit; round += 1) {
        const next = queue.tasks.shift();
        if (!next) return outcomes;
        clock.advance(next.delaySeconds * 1000);
        outcomes.push(await runStep(harness.deps(), next.task));
      }
      if (maxTasks === undefined && queue.tasks.length > 0) throw new Error(`Queue still not empty after ${limit} tasks`);
      return outcomes;
    },
  };
  return harness;
}

export interface EngineSuiteSetup {
  readonly options?: Partial<EngineOptions>;
  /** A file's own per-test state, set after the project and queue are emptied. */
  readonly beforeEach?: () => void | Promise<void>;
  readonly afterEach?: () => unknown;
}

/**
 * One engine harness for a whole test file: every test starts from an empty project, an empty
 * queue and the test pipeline's default behaviour, and the client closes after the file.
 */
export function engineSuite(label: string, pipelinesOrFactory: Parameters<typeof engineHarness>[1], setup: EngineSuiteSetup = {}): EngineHarness {
  const harness = engineHarness(label, pipelinesOrFactory, setup.options);
  beforeEach(async () => {
    resetBehaviour();
    harness.queue.drain();
    await harness.firestore.reset();
    await setup.beforeEach?.();
  });
  const { afterEach: afterEachTest } = setup;
  if (afterEachTest) {
    afterEach(async () => {
      await afterEachTest();
    });
  }
  afterAll(() => harness.firestore.close());
  return harness;
}

/** A job created by `store` as submit creates it (not queued: the test moves it where it needs it). */
export async function createdJob(store: JobStore, pipeline: string, input: unknown): Promise<JobRecord> {
  const result = await store.createJob({ owner: 'user-1', pipeline, input, conversationId: null, idempotencyKey: null });
  if (!('created' in result)) throw new Error('unexpected idempotency conflict');
  return result.job;
}

/** Puts a job in the state a test needs, as the engine would have written it. */
export async function putJob(store: JobStore, job: JobRecord, changes: Partial<JobRecord>): Promise<JobRecord> {
  const next = { ...job, ...changes };
  await store.jobRef(job.id).update(encodeJob(next));
  return next;
}

/**
 * Polls until `probe` holds (a worker held at a gate has written what the test waits for). Real time
 * only paces the polling; nothing waits for a lease, which moves on the injected clock.
 */
export async function waitUntil(probe: () => Promise<boolean>): Promise<void> {
  for (let tries = 0; tries < 5_000; tries += 1) {
    if (await probe()) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  throw new Error('condition never held');
}

/** A promise a test resolves by hand, to hold a worker at a chosen point. */
export function gate(): { promise: Promise<void>; open: () => void } {
  let open: () => void = () => undefined;
  const promise = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

/**
 * Runs queued tasks like `drain`, but a task still running when `killed` settles is abandoned
 * where it stands (its worker was killed there); returns once the queue is empty.
 */
export async function drainSurvivingKill(harness: EngineHarness, killed: Promise<void>, maxTasks = 300): Promise<StepOutcome[]> {
  const outcomes: StepOutcome[] = [];
  for (let round = 0; round < maxTasks; round += 1) {
    const next = harness.queue.tasks.shift();
    if (!next) return outcomes;
    harness.clock.advance(next.delaySeconds * 1000);
    const result = await Promise.race([runStep(harness.deps(), next.task), killed.then(() => 'killed' as const)]);
    if (result !== 'killed') outcomes.push(result);
  }
  throw new Error(`Queue still not empty after ${maxTasks} tasks`);
}

/** Moves the clock past the lease and runs the sweeper: the job of a killed worker is reclaimed and requeued. */
export async function reclaimAfterLease(harness: EngineHarness): Promise<void> {
  harness.clock.advance(harness.options.leaseSeconds * 1000 + 1);
  await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
}
