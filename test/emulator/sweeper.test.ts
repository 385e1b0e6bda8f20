import { Timestamp } from 'firebase-admin/firestore';
import { ManualClock } from '../../functions/src/core/clock';
import { stepTaskId, unitTaskId, type JobRecord } from '../../functions/src/core/job';
import { resolveEngineOptions, type EngineOptions } from '../../functions/src/core/options';
import { OperatorActionRefusedError, releaseQuarantined } from '../../functions/src/engine/operator';
import { sweep, SWEEP_MAX_PAGES, type SweepReport } from '../../functions/src/engine/sweeper';
import { decodeUnit, encodeJob, encodeUnit, type UnitRecord } from '../../functions/src/store/codec';
import { JobStore, type EventDraft, type JobTransaction } from '../../functions/src/store/job-store';
import { scheduledNowMs, sweepHandler } from '../../functions/src/triggers/sweep-jobs';
import { openTestFirestore, type TestFirestore } from '../support/firestore';
import { dyingInsideItsChange } from '../support/dead-client';
import { RecordingTaskQueue } from '../support/task-queue';
import { unitRecord as recordOf } from '../support/records';
import { createdJob, putJob as putJobIn } from '../support/engine';

const T0 = Date.UTC(2026, 0, 1, 12, 0, 0);
const SECOND = 1000;
const BASE_OPTIONS: Partial<EngineOptions> = { leaseSeconds: 180, heartbeatSeconds: 60, staleHeartbeatSeconds: 120, maxStaleReclaims: 3, lostTaskGraceSeconds: 120, sweepBatchSize: 50 };
const GRACE_MS = 120 * SECOND;

let firestore: TestFirestore;
let clock: ManualClock;
let store: JobStore;
let queue: RecordingTaskQueue;
let warnings: string[];

beforeAll(() => {
  firestore = openTestFirestore('sweeper');
});
beforeEach(async () => {
  await firestore.reset();
  clock = new ManualClock(T0);
  store = new JobStore(firestore.db, clock, resolveEngineOptions(BASE_OPTIONS));
  queue = new RecordingTaskQueue();
  warnings = [];
});
afterAll(() => firestore.close());

/** Sweeps at `nowMs` with the store's clock showing the same time (it stamps the writes). */
function sweepAt(nowMs: number, on: JobStore = store): Promise<SweepReport> {
  clock.set(nowMs);
  return sweep({ store: on, queue, log: (message) => warnings.push(message) }, nowMs);
}

const newJob = (on: JobStore = store): Promise<JobRecord> => createdJob(on, 'research', { topic: 'tides' });
const putJob = (job: JobRecord, changes: Partial<JobRecord>): Promise<JobRecord> => putJobIn(store, job, changes);

async function runningJob(leaseExpiresAtMs: number, changes: Partial<JobRecord> = {}, on: JobStore = store): Promise<JobRecord> {
  const job = await newJob(on);
  return putJob(job, { status: 'running', epoch: 1, step: 2, phase: 'draft', lease: { epoch: 1, worker: 'worker-a', expiresAtMs: leaseExpiresAtMs }, ...changes });
}

async function read(jobId: string): Promise<JobRecord> {
  const job = await store.read(jobId);
  if (!job) throw new Error(`job ${jobId} is missing`);
  return job;
}

async function events(jobId: string): Promise<{ kind: string; message: string; unit: string | null }[]> {
  const snapshot = await firestore.db.collection(`jobs/${jobId}/events`).orderBy('atMs').get();
  return snapshot.docs.map((doc) => ({ kind: String(doc.get('kind')), message: String(doc.get('message')), unit: (doc.get('unit') as string | null) ?? null }));
}

function unitRecord(jobId: string, unit: string, changes: Partial<UnitRecord>): UnitRecord {
  return recordOf({ jobId, unit, phase: 'experts', fanoutEpoch: 4, nextRunAtMs: T0, updatedAtMs: T0, ...changes });
}

async function putUnit(record: UnitRecord): Promise<void> {
  await store.unitRef(record.jobId, record.phase, record.unit).set(encodeUnit(record));
}

async function readUnit(jobId: string, unit: string): Promise<UnitRecord> {
  const snapshot = await store.unitRef(jobId, 'experts', unit).get();
  return decodeUnit(snapshot.ref.path, snapshot.data());
}

/** A job in fan-out epoch 4: running, no lease of its own, its units hold the leases. */
async function fanOutJob(): Promise<JobRecord> {
  const job = await newJob();
  return putJob(job, { status: 'running', epoch: 4, step: 3, phase: 'experts', lease: null, fanout: { phase: 'experts', epoch: 4, units: 2, done: 0 } });
}

describe('expired job leases', () => {
  test('an expired lease is reclaimed at a new step with a deterministic task; a live lease is left alone', async () => {
    const dead = await runningJob(T0 - SECOND, { lease: { epoch: 1, worker: 'worker-dead', expiresAtMs: T0 - SECOND } });
    const live = await runningJob(T0 + 60 * SECOND);
    const liveBefore = await store.jobRef(live.id).get();

    const report = await sweepAt(T0);

    expect(report).toMatchObject({ reclaimed: 1, quarantined: 0, enqueued: 1, enqueueFailures: 0, errors: 0 });
    const reclaimed = await read(dead.id);
    expect(reclaimed).toMatchObject({ status: 'queued', lease: null, staleReclaims: 1, step: 3, dispatch: 0, nextRunAtMs: T0, epoch: 1 });
    expect(queue.tasks).toEqual([{ id: stepTaskId(dead.id, 3, 0), task: { jobId: dead.id, step: 3 }, delaySeconds: 0 }]);
    const reclaimedEvent = (await events(dead.id)).find((event) => event.kind === 'reclaimed');
    expect(reclaimedEvent?.message).toMatch(/epoch 1 held by worker-dead expired/);

    const liveAfter = await store.jobRef(live.id).get();
    expect(liveAfter.updateTime?.isEqual(liveBefore.updateTime!)).toBe(true);
    expect(await read(live.id)).toMatchObject({ status: 'running', staleReclaims: 0, step: 2 });
  });

  test('a lease that expires exactly now is expired; one a millisecond later is not', async () => {
    const atNow = await runningJob(T0);
    const later = await runningJob(T0 + 1);
    await sweepAt(T0);
    expect((await read(atNow.id)).status).toBe('queued');
    expect((await read(later.id)).status).toBe('running');
  });

  test('a job past maxStaleReclaims is quarantined with the reason visible, and no task', async () => {
    const poison = await runningJob(T0 - SECOND, { staleReclaims: 3 });

    const report = await sweepAt(T0);

    expect(report).toMatchObject({ reclaimed: 0, quarantined: 1, enqueued: 0 });
    const job = await read(poison.id);
    expect(job).toMatchObject({ status: 'quarantined', lease: null, staleReclaims: 4, finishedAtMs: T0 });
    expect(job.quarantine?.reason).toMatch(/expired 4 times \(limit 3\)/);
    expect(queue.tasks).toEqual([]);
    const quarantined = (await events(poison.id)).find((event) => event.kind === 'quarantined');
    expect(quarantined?.message).toContain(job.quarantine?.reason);
  });

  test('fault 7: the sweeper racing a heartbeat leaves the job alone', async () => {
    const job = await runningJob(T0 - SECOND);
    /** Extends the lease, as the owner's heartbeat would, after the sweep's query and before its transaction. */
    class HeartbeatFirst extends JobStore {
      override async transact<T>(
        jobId: string,
        check: (job: JobRecord) => string | null,
        body: (context: JobTransaction) => Promise<{ next?: JobRecord; events?: readonly EventDraft[]; value: T }>,
      ): Promise<T> {
        await store.jobRef(jobId).update({ 'lease.expiresAt': Timestamp.fromMillis(T0 + 180 * SECOND) });
        return super.transact(jobId, check, body);
      }
    }
    const racing = new HeartbeatFirst(firestore.db, clock, store.options);

    const report = await sweepAt(T0, racing);

    expect(report).toMatchObject({ queryDocuments: 1, reclaimed: 0, skipped: 1, errors: 0 });
    expect(await read(job.id)).toMatchObject({ status: 'running', staleReclaims: 0, step: 2, lease: { epoch: 1, expiresAtMs: T0 + 180 * SECOND } });
    expect(queue.tasks).toEqual([]);
    expect((await events(job.id)).map((event) => event.kind)).toEqual(['submitted']);
  });

  test.each([
    ['another claim took it, and that lease has expired too', { epoch: 2, lease: { epoch: 2, worker: 'worker-b', expiresAtMs: T0 - 1 } }, 'running'],
    ['it was cancelled (its lease left in place)', { status: 'cancelled', finishedAtMs: T0 - 1 }, 'cancelled'],
  ] as const)('a job that changed since the query is left alone: %s', async (_, change, status) => {
    const job = await runningJob(T0 - SECOND);
    class ChangedMeanwhile extends JobStore {
      override async transact<T>(
        jobId: string,
        check: (job: JobRecord) => string | null,
        body: (context: JobTransaction) => Promise<{ next?: JobRecord; events?: readonly EventDraft[]; value: T }>,
      ): Promise<T> {
        await store.jobRef(jobId).update(encodeJob({ ...job, ...change }));
        return super.transact(jobId, check, body);
      }
    }
    const report = await sweepAt(T0, new ChangedMeanwhile(firestore.db, clock, store.options));
    expect(report).toMatchObject({ reclaimed: 0, quarantined: 0, skipped: 1 });
    expect(await read(job.id)).toMatchObject({ status, staleReclaims: 0, step: 2 });
    expect(queue.tasks).toEqual([]);
  });

  test('two sweeps at the same time act on each job once, with one task each', async () => {
    const jobs = await Promise.all(Array.from({ length: 6 }, () => runningJob(T0 - SECOND)));
    const lost = await Promise.all(Array.from({ length: 2 }, async () => putJob(await newJob(), { nextRunAtMs: T0 - GRACE_MS })));
    const waiting = await putJob(await newJob(), { status: 'waiting', step: 1, waiting: { reason: 'provider', questionId: 'provider', question: 'Provider down', options: [], untilMs: T0 } });

    const reports = await Promise.all([sweepAt(T0), sweepAt(T0)]);

    const total = (key: 'reclaimed' | 'redispatched' | 'resumed' | 'errors') => reports.reduce((sum, report) => sum + report[key], 0);
    expect([total('reclaimed'), total('redispatched'), total('resumed'), total('errors')]).toEqual([6, 2, 1, 0]);
    expect(queue.tasks.map((task) => task.id).sort()).toEqual(
      [...jobs.map((job) => stepTaskId(job.id, 3, 0)), ...lost.map((job) => stepTaskId(job.id, 0, 1)), stepTaskId(waiting.id, 2, 0)].sort(),
    );
    expect(queue.duplicates).toEqual([]);
    for (const job of jobs) {
      expect(await read(job.id)).toMatchObject({ status: 'queued', staleReclaims: 1, step: 3 });
      expect((await events(job.id)).filter((event) => event.kind === 'reclaimed')).toHaveLength(1);
    }
    for (const job of lost) expect(await read(job.id)).toMatchObject({ dispatch: 1 });
  });

  test('an enqueue failure is counted and logged, not thrown, and the lost-task rule dispatches the step later', async () => {
    const job = await runningJob(T0 - SECOND);
    queue.failNext = 1;

    const report = await sweepAt(T0);

    expect(report).toMatchObject({ reclaimed: 1, enqueued: 0, enqueueFailures: 1 });
    expect(warnings).toEqual([expect.stringMatching(/enqueue failed/)]);
    expect(queue.tasks).toEqual([]);
    expect(await read(job.id)).toMatchObject({ status: 'queued', step: 3, dispatch: 0 });

    const later = await sweepAt(T0 + GRACE_MS);
    expect(later).toMatchObject({ redispatched: 1, enqueued: 1 });
    expect(queue.tasks.map((task) => task.id)).toEqual([stepTaskId(job.id, 3, 1)]);
  });
});

describe('bounded, index-backed paging', () => {
  test('10 expired jobs among 50 healthy ones: all reclaimed in pages of 3, reading only the expired ones', async () => {
    const small = new JobStore(firestore.db, clock, resolveEngineOptions({ ...BASE_OPTIONS, sweepBatchSize: 3 }));
    const expired = await Promise.all(Array.from({ length: 10 }, (_, index) => runningJob(T0 - (index + 1) * SECOND, {}, small)));
    await Promise.all([
      ...Array.from({ length: 20 }, () => runningJob(T0 + 90 * SECOND, {}, small)),
      ...Array.from({ length: 15 }, () => newJob(small)), // queued and due now: their tasks are on their way
      ...Array.from({ length: 10 }, async () => putJob(await newJob(small), { status: 'completed', outcome: 'complete', finishedAtMs: T0 })),
      ...Array.from({ length: 5 }, async () =>
        putJob(await newJob(small), { status: 'waiting', waiting: { reason: 'decision', questionId: 'q1', question: 'Which source?', options: ['a', 'b'], untilMs: null } }),
      ),
    ]);

    const report = await sweepAt(T0, small);

    expect(report.reclaimed).toBe(10);
    expect(report.truncated).toEqual([]);
    expect(new Set(queue.tasks.map((task) => task.task.jobId))).toEqual(new Set(expired.map((job) => job.id)));
    // 4 pages of expired leases (3 + 3 + 3 + 1) and one empty page for each of the other four queries.
    expect(report.queryPages).toBe(4 + 4);
    expect(report.queryDocuments).toBe(10);
    // Each expired job is read once by its query and once in its transaction; the 50 healthy jobs not at all.
    expect(report.documentsRead).toBe(20);

    const again = await sweepAt(T0, small);
    expect(again).toMatchObject({ reclaimed: 0, queryDocuments: 0, documentsRead: 0 });
  });

  test(`a query stops after ${SWEEP_MAX_PAGES} pages, says so, and the next run continues`, async () => {
    const single = new JobStore(firestore.db, clock, resolveEngineOptions({ ...BASE_OPTIONS, sweepBatchSize: 1 }));
    const jobs = await Promise.all(Array.from({ length: SWEEP_MAX_PAGES + 1 }, (_, index) => runningJob(T0 - (index + 1) * SECOND, {}, single)));

    const first = await sweepAt(T0, single);
    expect(first).toMatchObject({ reclaimed: SWEEP_MAX_PAGES, truncated: ['expiredJobLeases'] });
    // Oldest expiry first: the job whose lease expired last is the one left for the next run.
    const newest = jobs[0]!;
    expect((await read(newest.id)).status).toBe('running');

    const second = await sweepAt(T0 + 60 * SECOND, single);
    expect(second).toMatchObject({ reclaimed: 1, truncated: [] });
    expect((await read(newest.id)).status).toBe('queued');
  });
});

describe('quarantine release', () => {
  test('a quarantined job goes back to the queue with a fresh budget and a task', async () => {
    const job = await runningJob(T0 - SECOND, { staleReclaims: 3, attempts: 2 });
    await sweepAt(T0);
    expect((await read(job.id)).status).toBe('quarantined');

    clock.set(T0 + 3_600 * SECOND);
    const released = await releaseQuarantined(store, queue, job.id, T0 + 3_600 * SECOND);

    expect(released).toMatchObject({ enqueued: true, taskId: stepTaskId(job.id, 3, 0) });
    expect(await read(job.id)).toMatchObject({
      status: 'queued',
      attempts: 0,
      staleReclaims: 0,
      quarantine: null,
      lease: null,
      step: 3,
      dispatch: 0,
      nextRunAtMs: T0 + 3_600 * SECOND,
      finishedAtMs: null,
    });
    expect(queue.tasks).toEqual([{ id: stepTaskId(job.id, 3, 0), task: { jobId: job.id, step: 3 }, delaySeconds: 0 }]);
    const releasedEvent = (await events(job.id)).find((event) => event.kind === 'released');
    expect(releasedEvent?.message).toMatch(/quarantined because its lease expired 4 times/);
  });

  test('a release also gives the units of a quarantined fan-out a fresh stale-reclaim budget', async () => {
    const job = await fanOutJob();
    await putUnit(unitRecord(job.id, 'alpha', { status: 'running', epoch: 3, staleReclaims: 3, lease: { epoch: 3, worker: 'worker-u', expiresAtMs: T0 - SECOND } }));
    await putUnit(unitRecord(job.id, 'beta', { status: 'done', staleReclaims: 2, result: { ok: true } }));
    await sweepAt(T0);
    expect((await read(job.id)).status).toBe('quarantined');

    await releaseQuarantined(store, queue, job.id, T0 + 60 * SECOND);

    expect((await readUnit(job.id, 'alpha')).staleReclaims).toBe(0);
    expect((await readUnit(job.id, 'beta')).staleReclaims).toBe(2); // finished work is left as it is
  });

  test('an operator whose release dies inside it (units and ledger read, commit never sent) holds nothing: a second release lands at once, once', async () => {
    const job = await fanOutJob();
    await putUnit(unitRecord(job.id, 'alpha', { status: 'running', epoch: 3, staleReclaims: 3, lease: { epoch: 3, worker: 'worker-u', expiresAtMs: T0 - SECOND } }));
    await sweepAt(T0);
    expect((await read(job.id)).status).toBe('quarantined');
    const dying = dyingInsideItsChange(store);
    void releaseQuarantined(dying.store, queue, job.id, T0 + 60 * SECOND);
    await dying.decided;

    const released = await releaseQuarantined(store, queue, job.id, T0 + 60 * SECOND);

    expect(released).toMatchObject({ enqueued: true });
    expect(await read(job.id)).toMatchObject({ status: 'queued', staleReclaims: 0 });
    expect((await readUnit(job.id, 'alpha')).staleReclaims).toBe(0);
    expect((await events(job.id)).filter((event) => event.kind === 'released')).toHaveLength(1);
    expect(queue.tasks.map((task) => task.id)).toEqual([released.taskId]);
  });

  test('releasing a job that is not quarantined is refused with a clear error, and nothing changes', async () => {
    const running = await runningJob(T0 + 60 * SECOND);
    await expect(releaseQuarantined(store, queue, running.id, T0)).rejects.toThrow(OperatorActionRefusedError);
    await expect(releaseQuarantined(store, queue, running.id, T0)).rejects.toThrow(/is running; only a quarantined job can be released/);
    await expect(releaseQuarantined(store, queue, 'no-such-job', T0)).rejects.toThrow(/no-such-job cannot be released: Job no-such-job does not exist/);
    expect(await read(running.id)).toMatchObject({ status: 'running', step: 2 });
    expect(queue.tasks).toEqual([]);
  });
});

describe('expired unit leases', () => {
  test('an expired unit lease is reclaimed on the unit, with a new unit task; a live one is left alone', async () => {
    const job = await fanOutJob();
    await putUnit(unitRecord(job.id, 'alpha', { status: 'running', epoch: 2, step: 1, lease: { epoch: 2, worker: 'worker-u', expiresAtMs: T0 - SECOND } }));
    await putUnit(unitRecord(job.id, 'beta', { status: 'running', epoch: 1, step: 0, lease: { epoch: 1, worker: 'worker-v', expiresAtMs: T0 + 60 * SECOND } }));

    const report = await sweepAt(T0);

    expect(report).toMatchObject({ unitsReclaimed: 1, reclaimed: 0, quarantined: 0, errors: 0 });
    expect(await readUnit(job.id, 'alpha')).toMatchObject({ status: 'queued', lease: null, staleReclaims: 1, step: 2, dispatch: 1, nextRunAtMs: T0 });
    expect(await readUnit(job.id, 'beta')).toMatchObject({ status: 'running', lease: { epoch: 1 }, staleReclaims: 0, step: 0 });
    expect(queue.tasks).toEqual([{ id: unitTaskId(job.id, 4, 'alpha', 2, 1), task: { jobId: job.id, step: 2, unit: 'alpha', phase: 'experts' }, delaySeconds: 0 }]);
    expect(await read(job.id)).toMatchObject({ status: 'running', lease: null, fanout: { epoch: 4 } });
    const reclaimed = (await events(job.id)).find((event) => event.kind === 'reclaimed');
    expect(reclaimed).toMatchObject({ unit: 'alpha' });
    expect(reclaimed?.message).toMatch(/epoch 2 held by worker-u expired/);
  });

  test('a unit past maxStaleReclaims quarantines the whole job, naming the unit, with no task', async () => {
    const job = await fanOutJob();
    await putUnit(unitRecord(job.id, 'alpha', { status: 'running', epoch: 5, staleReclaims: 3, lease: { epoch: 5, worker: 'worker-u', expiresAtMs: T0 - SECOND } }));

    const report = await sweepAt(T0);

    expect(report).toMatchObject({ quarantined: 1, unitsReclaimed: 0, enqueued: 0 });
    const quarantined = await read(job.id);
    expect(quarantined).toMatchObject({ status: 'quarantined', finishedAtMs: T0 });
    expect(quarantined.quarantine?.reason).toMatch(/^unit alpha: its lease expired 4 times \(limit 3\)/);
    expect(await readUnit(job.id, 'alpha')).toMatchObject({ lease: null, staleReclaims: 4 });
    expect(queue.tasks).toEqual([]);

    // The unit no longer matches any sweep query.
    expect(await sweepAt(T0 + 10 * 60 * SECOND)).toMatchObject({ queryDocuments: 0 });
  });

  test('a sweeper that dies inside a unit quarantine (fan-out read, commit never sent) holds nothing: a second sweep quarantines the job at once, charging the fan-out once', async () => {
    const job = await fanOutJob();
    await putUnit(unitRecord(job.id, 'alpha', { status: 'running', epoch: 5, staleReclaims: 3, cost: { usd: 1 }, lease: { epoch: 5, worker: 'worker-u', expiresAtMs: T0 - SECOND } }));
    await putUnit(unitRecord(job.id, 'beta', { status: 'running', epoch: 2, cost: { usd: 2 }, lease: { epoch: 2, worker: 'worker-v', expiresAtMs: T0 + 60 * SECOND } }));
    const dying = dyingInsideItsChange(store);
    void sweep({ store: dying.store, queue, log: () => undefined }, T0);
    await dying.decided;

    const report = await sweepAt(T0);

    expect(report).toMatchObject({ quarantined: 1, errors: 0 });
    expect(await read(job.id)).toMatchObject({ status: 'quarantined', cost: { usd: 3 } });
    expect(await readUnit(job.id, 'alpha')).toMatchObject({ lease: null, staleReclaims: 4, costInJob: { usd: 1 } });
    expect(await readUnit(job.id, 'beta')).toMatchObject({ costInJob: { usd: 2 } });
    expect((await events(job.id)).filter((event) => event.kind === 'quarantined')).toHaveLength(1);
  });

  test('units left over from a fan-out that ended are parked, not requeued, and drop out of the sweep', async () => {
    const job = await fanOutJob();
    await putUnit(unitRecord(job.id, 'alpha', { status: 'running', epoch: 2, lease: { epoch: 2, worker: 'worker-u', expiresAtMs: T0 - SECOND } }));
    await putUnit(unitRecord(job.id, 'beta', { status: 'queued', nextRunAtMs: T0 - GRACE_MS - SECOND }));
    await putJob(job, { status: 'cancelled', fanout: null, finishedAtMs: T0 - 30 * SECOND });

    const report = await sweepAt(T0);

    expect(report).toMatchObject({ parkedUnits: 2, unitsReclaimed: 0, unitsRedispatched: 0, errors: 0 });
    expect(queue.tasks).toEqual([]);
    expect(await readUnit(job.id, 'alpha')).toMatchObject({ status: 'running', lease: null, lastError: { code: 'parked' } });
    expect((await readUnit(job.id, 'beta')).lastError?.message).toMatch(/its job is cancelled/);
    expect(await sweepAt(T0 + 10 * 60 * SECOND)).toMatchObject({ queryDocuments: 0 });
  });

  test('the sweeper racing a unit heartbeat leaves the unit alone', async () => {
    const job = await fanOutJob();
    await putUnit(unitRecord(job.id, 'alpha', { status: 'running', epoch: 2, lease: { epoch: 2, worker: 'worker-u', expiresAtMs: T0 - SECOND } }));
    class UnitHeartbeatFirst extends JobStore {
      override async retryingWrite<T>(what: string, write: () => Promise<T>): Promise<T> {
        await store.unitRef(job.id, 'experts', 'alpha').update({ 'lease.expiresAt': Timestamp.fromMillis(T0 + 180 * SECOND) });
        return super.retryingWrite(what, write);
      }
    }

    const report = await sweepAt(T0, new UnitHeartbeatFirst(firestore.db, clock, store.options));

    expect(report).toMatchObject({ queryDocuments: 1, skipped: 1, unitsReclaimed: 0, errors: 0 });
    expect(await readUnit(job.id, 'alpha')).toMatchObject({ status: 'running', staleReclaims: 0, lease: { epoch: 2, expiresAtMs: T0 + 180 * SECOND } });
    expect(queue.tasks).toEqual([]);
  });

  test('a unit of a job that is not in its fan-out yet (same epoch, queued) is skipped, not parked', async () => {
    const job = await fanOutJob();
    await putUnit(unitRecord(job.id, 'alpha', { status: 'running', epoch: 2, lease: { epoch: 2, worker: 'worker-u', expiresAtMs: T0 - SECOND } }));
    await putJob(job, { status: 'queued', fanout: null });

    const report = await sweepAt(T0);

    expect(report).toMatchObject({ skipped: 1, parkedUnits: 0, unitsReclaimed: 0 });
    expect(await readUnit(job.id, 'alpha')).toMatchObject({ status: 'running', lease: { epoch: 2 } });
  });
});

describe('lost tasks', () => {
  test('a queued job whose task never came is dispatched again once per grace period', async () => {
    const job = await newJob(); // queued, step 0, due at T0

    expect(await sweepAt(T0 + GRACE_MS - 1)).toMatchObject({ redispatched: 0 });
    expect(queue.tasks).toEqual([]);

    expect(await sweepAt(T0 + GRACE_MS)).toMatchObject({ redispatched: 1 });
    expect(await read(job.id)).toMatchObject({ status: 'queued', step: 0, dispatch: 1, nextRunAtMs: T0 + GRACE_MS });
    expect(queue.drain().map((task) => task.id)).toEqual([stepTaskId(job.id, 0, 1)]);

    // The next sweeps within the same grace period leave it alone.
    expect(await sweepAt(T0 + GRACE_MS + 60 * SECOND)).toMatchObject({ redispatched: 0 });
    expect(await sweepAt(T0 + 2 * GRACE_MS - 1)).toMatchObject({ redispatched: 0 });
    expect(queue.tasks).toEqual([]);

    expect(await sweepAt(T0 + 2 * GRACE_MS)).toMatchObject({ redispatched: 1 });
    expect(queue.drain()).toEqual([{ id: stepTaskId(job.id, 0, 2), task: { jobId: job.id, step: 0 }, delaySeconds: 0 }]);
    expect((await events(job.id)).filter((event) => event.kind === 'redispatched')).toHaveLength(2);
  });

  test('a backing-off job is not lost: only a grace period after its nextRunAt', async () => {
    const job = await putJob(await newJob(), { step: 4, attempts: 1, nextRunAtMs: T0 + 300 * SECOND });
    expect(await sweepAt(T0 + 300 * SECOND + GRACE_MS - 1)).toMatchObject({ redispatched: 0 });
    expect(await sweepAt(T0 + 300 * SECOND + GRACE_MS)).toMatchObject({ redispatched: 1 });
    expect(queue.tasks.map((task) => task.id)).toEqual([stepTaskId(job.id, 4, 1)]);
  });

  test('a queued unit whose task went missing is dispatched again under a new unit task ID', async () => {
    const job = await fanOutJob();
    await putUnit(unitRecord(job.id, 'alpha', { status: 'queued', step: 2, dispatch: 0, nextRunAtMs: T0 }));

    expect(await sweepAt(T0 + GRACE_MS - 1)).toMatchObject({ unitsRedispatched: 0 });
    expect(await sweepAt(T0 + GRACE_MS)).toMatchObject({ unitsRedispatched: 1 });
    expect(await sweepAt(T0 + GRACE_MS + 60 * SECOND)).toMatchObject({ unitsRedispatched: 0 });

    expect(await readUnit(job.id, 'alpha')).toMatchObject({ status: 'queued', step: 2, dispatch: 1, nextRunAtMs: T0 + GRACE_MS });
    expect(queue.tasks).toEqual([{ id: unitTaskId(job.id, 4, 'alpha', 2, 1), task: { jobId: job.id, step: 2, unit: 'alpha', phase: 'experts' }, delaySeconds: 0 }]);
    expect((await events(job.id)).find((event) => event.kind === 'redispatched')).toMatchObject({ unit: 'alpha' });
  });
});

describe('waits', () => {
  test('a provider wait whose time is up resumes; a decision wait never does', async () => {
    const provider = await putJob(await newJob(), {
      status: 'waiting',
      step: 5,
      waiting: { reason: 'provider', questionId: 'provider', question: 'The model provider is down', options: [], untilMs: T0 + 10 * SECOND },
    });
    const decision = await putJob(await newJob(), {
      status: 'waiting',
      step: 5,
      waiting: { reason: 'decision', questionId: 'q1', question: 'Send the email?', options: ['yes', 'no'], untilMs: null },
    });

    expect(await sweepAt(T0 + 10 * SECOND - 1)).toMatchObject({ resumed: 0 });
    expect(await sweepAt(T0 + 10 * SECOND)).toMatchObject({ resumed: 1 });
    expect(await read(provider.id)).toMatchObject({ status: 'queued', waiting: null, step: 6, dispatch: 0, nextRunAtMs: T0 + 10 * SECOND });
    expect(queue.tasks).toEqual([{ id: stepTaskId(provider.id, 6, 0), task: { jobId: provider.id, step: 6 }, delaySeconds: 0 }]);
    expect((await events(provider.id)).map((event) => event.kind)).toContain('resumed');

    expect(await sweepAt(T0 + 90 * 24 * 3_600 * SECOND)).toMatchObject({ resumed: 0 });
    expect(await read(decision.id)).toMatchObject({ status: 'waiting', step: 5, waiting: { reason: 'decision', untilMs: null } });
  });
});

describe('the sweepJobs trigger', () => {
  test('now is the schedule time from the event, the wall clock only without one', () => {
    expect(scheduledNowMs('2026-01-01T12:00:00.000Z', () => 7)).toBe(T0);
    expect(scheduledNowMs(undefined, () => 7)).toBe(7);
    expect(scheduledNowMs('not a time', () => 7)).toBe(7);
  });

  test('the handler sweeps at the scheduled time, not at the wall clock', async () => {
    // The wall clock is years past both expiries; only the schedule time tells them apart.
    const scheduled = Date.UTC(2020, 0, 1);
    clock.set(scheduled);
    const expired = await runningJob(scheduled - SECOND);
    const notYet = await runningJob(scheduled + SECOND);
    await sweepHandler(() => ({ store, queue, log: (message) => warnings.push(message) }))({ scheduleTime: new Date(scheduled).toISOString() });
    expect((await read(expired.id)).status).toBe('queued');
    expect((await read(notYet.id)).status).toBe('running');
  });
});
