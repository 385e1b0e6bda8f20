/**
 * Bug 15: the exported trigger objects (functions/src/index.ts) run as the platform runs them,
 * through firebase-functions-test, against the official Firestore emulator and a recording queue:
 * their deployment options, the schedule time the sweep is handed, a task's retry count, and
 * which outcomes make the task handler throw (Cloud Tasks redelivers) or return (acknowledged).
 */
import { logger } from 'firebase-functions';
import type { CloudEvent, CloudFunction } from 'firebase-functions/v2';
import type { Request as TaskRequest } from 'firebase-functions/v2/tasks';
import firebaseFunctionsTest from 'firebase-functions-test';
import { systemClock } from '../../functions/src/core/clock';
import { realTimers } from '../../functions/src/core/flusher';
import { stepTaskId, type JobRecord } from '../../functions/src/core/job';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { runJobStep, sweepJobs } from '../../functions/src/index';
import { decodeJob } from '../../functions/src/store/codec';
import { JobStore } from '../../functions/src/store/job-store';
import { JOBS, REJECTED_TASKS } from '../../functions/src/store/paths';
import { provideBackends } from '../../functions/src/triggers/admin';
import { openTestFirestore } from '../support/firestore';
import { RecordingTaskQueue } from '../support/task-queue';
import { createdJob, putJob as putJobIn } from '../support/engine';

const SECOND = 1000;
const firestore = openTestFirestore('triggers');
const queue = new RecordingTaskQueue();
const functionsTest = firebaseFunctionsTest({ projectId: firestore.projectId });
// The triggers keep their own JobStore on the system clock; this one only sets up and reads state.
const store = new JobStore(firestore.db, systemClock, resolveEngineOptions());

/** The task handler as Cloud Tasks invokes it, with the request fields the test gives. */
type DeliveredTask = Partial<Omit<TaskRequest<unknown>, 'rawRequest'>>;
// firebase-functions-test 3.5 types wrap() for CloudEvent functions only; at run time it hands a
// task queue function's run() the request as given.
const deliverTask = functionsTest.wrap(runJobStep as unknown as CloudFunction<CloudEvent<unknown>>) as (task: DeliveredTask) => Promise<void>;

/** What Cloud Tasks sets on a delivery; `retryCount` is 0 on the first one. */
function delivery(data: unknown, retryCount = 0): DeliveredTask {
  return { data, queueName: 'runJobStep', id: `task-${retryCount}`, retryCount, executionCount: retryCount, scheduledTime: new Date().toISOString() };
}

/** What the triggers told the Cloud Functions logger. */
let logged: { message: unknown; fields: unknown }[] = [];
const capture = (message: unknown, fields: unknown): void => {
  logged.push({ message, fields });
};

beforeAll(() => {
  provideBackends({ firestore: firestore.db, queue });
  jest.spyOn(logger, 'info').mockImplementation(capture);
  jest.spyOn(logger, 'warn').mockImplementation(capture);
});
beforeEach(async () => {
  queue.drain();
  logged = [];
  await firestore.reset();
});
afterAll(async () => {
  functionsTest.cleanup();
  await firestore.close();
});

const newJob = (pipeline = 'canary', input: unknown = { text: 'One paragraph.\n\nAnother one.' }): Promise<JobRecord> => createdJob(store, pipeline, input);
const putJob = (job: JobRecord, changes: Partial<JobRecord>): Promise<JobRecord> => putJobIn(store, job, changes);

async function read(jobId: string): Promise<JobRecord> {
  return decodeJob(jobId, (await firestore.db.doc(`${JOBS}/${jobId}`).get()).data());
}

describe('the deployed trigger objects', () => {
  test('bug 15: carry the deployment options the README documents', () => {
    expect(runJobStep.__endpoint).toMatchObject({
      platform: 'gcfv2',
      timeoutSeconds: 540,
      availableMemoryMb: 512,
      taskQueueTrigger: {
        retryConfig: { maxAttempts: 20, minBackoffSeconds: 2, maxBackoffSeconds: 300, maxDoublings: 8 },
        rateLimits: { maxConcurrentDispatches: 100, maxDispatchesPerSecond: 50 },
      },
    });
    expect(sweepJobs.__endpoint).toMatchObject({
      platform: 'gcfv2',
      timeoutSeconds: 300,
      scheduleTrigger: { schedule: 'every 1 minutes', retryConfig: { retryCount: 0 } },
    });
  });
});

describe('sweepJobs', () => {
  test('bug 15: sweeps at the schedule time it is handed: a lease expired then is reclaimed, one still live then is not', async () => {
    // Years before the wall clock, so a sweep at the wall clock (or the store's clock) would reclaim both.
    const scheduled = Date.UTC(2020, 0, 1, 12, 0, 0);
    const running = { status: 'running', epoch: 1, step: 2, phase: 'measure' } as const;
    const expired = await putJob(await newJob(), { ...running, lease: { epoch: 1, worker: 'gone', expiresAtMs: scheduled - SECOND } });
    const live = await putJob(await newJob(), { ...running, lease: { epoch: 1, worker: 'busy', expiresAtMs: scheduled + SECOND } });

    await sweepJobs.run({ scheduleTime: new Date(scheduled).toISOString(), jobName: 'firebase-schedule-sweepJobs-us-central1' });

    expect(await read(expired.id)).toMatchObject({ status: 'queued', step: 3, staleReclaims: 1, lease: null });
    expect(await read(live.id)).toMatchObject({ status: 'running', step: 2, staleReclaims: 0, lease: { expiresAtMs: scheduled + SECOND } });
    expect(queue.tasks).toEqual([{ id: stepTaskId(expired.id, 3, 0), task: { jobId: expired.id, step: 3 }, delaySeconds: 0 }]);
    expect(logged).toContainEqual({ message: expect.stringMatching(/^sweepJobs finished/) as unknown, fields: expect.objectContaining({ now: new Date(scheduled).toISOString(), reclaimed: 1 }) as unknown });
  });
});

describe('runJobStep', () => {
  test('bug 15: runs a delivered task as one step and hands off; a redelivery of that task (retry count 2) is acknowledged and changes nothing', async () => {
    const job = await newJob();
    await expect(deliverTask(delivery({ jobId: job.id, step: 0 }))).resolves.toBeUndefined();
    const handedOff = await read(job.id);
    expect(handedOff).toMatchObject({ status: 'queued', step: 1, epoch: 1, lease: null });
    expect(queue.drain().map((recorded) => recorded.id)).toEqual([stepTaskId(job.id, 1, 0)]);

    // The first delivery's answer was lost: Cloud Tasks sends the same task again.
    const updateTime = async () => (await store.jobRef(job.id).get()).updateTime?.valueOf();
    const before = await updateTime();
    logged = [];
    await expect(deliverTask(delivery({ jobId: job.id, step: 0 }, 2))).resolves.toBeUndefined();
    expect(await updateTime()).toBe(before);
    expect(queue.tasks).toEqual([]);
    expect(logged).toContainEqual({ message: 'step finished', fields: expect.objectContaining({ retryCount: 2, outcome: expect.objectContaining({ kind: 'not-claimable' }) as unknown }) as unknown });
  });

  test('bug 15: a task that comes while its job backs off makes the handler throw, so that Cloud Tasks redelivers it', async () => {
    const job = await putJob(await newJob(), { nextRunAtMs: Date.now() + 3_600 * SECOND, attempts: 1 });
    await expect(deliverTask(delivery({ jobId: job.id, step: 0 }, 1))).rejects.toThrow(/backing off for another 3[56]\d\d s; redeliver later/);
    expect(await read(job.id)).toMatchObject({ status: 'queued', step: 0, epoch: 0, attempts: 1 });
    expect(queue.tasks).toEqual([]);
  });

  test('a task that comes shortly before its job is due waits for it in its request and runs the step, without a redelivery', async () => {
    const job = await putJob(await newJob(), { nextRunAtMs: Date.now() + 8 * SECOND, attempts: 1 });
    // The trigger runs on the real clock and timers: its wait is ended by moving the job's due time, not by sleeping through it.
    const waits: number[] = [];
    jest.spyOn(realTimers, 'setTimeout').mockImplementationOnce((callback, ms) => {
      waits.push(ms);
      void putJob(job, { nextRunAtMs: Date.now() - 1, attempts: 1 }).then(callback);
      return 0;
    });
    logged = [];
    await expect(deliverTask(delivery({ jobId: job.id, step: 0 }, 1))).resolves.toBeUndefined();
    expect(waits).toHaveLength(1);
    expect(waits[0]).toBeGreaterThan(0);
    expect(await read(job.id)).toMatchObject({ status: 'queued', step: 1, epoch: 1 });
    expect(logged).toContainEqual({
      message: 'step finished',
      fields: expect.objectContaining({ outcome: expect.objectContaining({ kind: 'handed-off' }) as unknown, claimTries: 2, tookMs: expect.any(Number) as unknown }) as unknown,
    });
  });

  test.each([
    ['a payload without a step', { jobId: 'abc' }, /Malformed task payload/],
    ['a payload that is not an object', 'run job abc', /Malformed task payload/],
    ['a payload naming a reserved document ID', { jobId: '__x__', step: 0 }, /__name__/],
    ['a task for a job that does not exist', { jobId: 'no-such-job', step: 0 }, /No such job: no-such-job/],
  ])('bug 15: %s returns normally (acknowledged) and is recorded in rejectedTasks', async (_name, data, reason) => {
    await expect(deliverTask(delivery(data, 4))).resolves.toBeUndefined();
    const rejected = await firestore.db.collection(REJECTED_TASKS).get();
    expect(rejected.docs.map((doc) => doc.get('reason') as string)).toEqual([expect.stringMatching(reason)]);
    expect(queue.tasks).toEqual([]);
  });
});
