/**
 * Retention on the official emulator: an ended job's transcripts, events and artifacts get
 * `expireAt = endedAt + retentionDays` from the sweeper, in bounded, resumable passes; what the job
 * keeps (its document, answer, sections, checkpoints, units, claims) never does; a rejected task is
 * stamped when written. The emulator never deletes expired documents: these tests check the stamps.
 */
import { Timestamp, type Firestore } from 'firebase-admin/firestore';
import type { JobRecord, JobStatus } from '../../functions/src/core/job';
import { resolveEngineOptions, type EngineOptions } from '../../functions/src/core/options';
import { cancelJobRecord, completeJob, settleJobError } from '../../functions/src/core/transitions';
import { RETENTION_GRACE_MS, RETENTION_MAX_PAGES } from '../../functions/src/engine/retention';
import { runStep } from '../../functions/src/engine/step';
import { sweep, type SweepReport } from '../../functions/src/engine/sweeper';
import { encodeJob } from '../../functions/src/store/codec';
import { JobStore } from '../../functions/src/store/job-store';
import { EXPIRE_AT } from '../../functions/src/store/retention';
import { engineSuite } from '../support/engine';
import { aroundBatchCommits } from '../support/interpose';
import { researchSetup } from '../support/research';

const DAY_MS = 86_400_000;
const RETENTION_DAYS = 7;
/** A small sweep batch, so one sweep's bound (RETENTION_MAX_PAGES pages of it) is easy to exceed. */
const BATCH = 4;
const BOUND = RETENTION_MAX_PAGES * BATCH;


const harness = engineSuite('retention', (firestore, clock) => researchSetup(firestore.db, clock).registry, {
  options: { retentionDays: RETENTION_DAYS },
});

const db = (): Firestore => harness.firestore.db;

function storeWith(overrides: Partial<EngineOptions>, on: Firestore = db()): JobStore {
  return new JobStore(on, harness.clock, resolveEngineOptions({ ...harness.options, ...overrides }));
}

/** Sweeps once the retention grace after everything ended so far has passed (and moves the clock there). */
function sweepNow(store: JobStore = harness.store, log: (message: string) => void = () => undefined): Promise<SweepReport> {
  harness.clock.advance(RETENTION_GRACE_MS);
  return sweep({ store, queue: harness.queue, log }, harness.clock.now());
}

async function readJob(jobId: string): Promise<JobRecord> {
  const job = await harness.store.read(jobId);
  if (!job) throw new Error(`job ${jobId} is missing`);
  return job;
}

/** Every document of a subcollection of the job, with its `expireAt` in milliseconds (null when absent). */
async function expiries(jobId: string, collection: string): Promise<(number | null)[]> {
  const snapshot = await db().collection(`jobs/${jobId}/${collection}`).get();
  return snapshot.docs.map((doc) => {
    const value: unknown = doc.get(EXPIRE_AT);
    return value instanceof Timestamp ? value.toMillis() : null;
  });
}

/** A job created by the store and put in `status` as the engine would, with its children. */
async function jobWithChildren(children: Partial<Record<'transcripts' | 'events' | 'artifacts' | 'artifactChunks' | 'sections', number>>): Promise<JobRecord> {
  const created = await harness.store.createJob({ owner: 'user-1', pipeline: 'research', input: {}, conversationId: null, idempotencyKey: null });
  if (!('created' in created)) throw new Error('unexpected idempotency conflict');
  const batch = db().batch();
  for (const [collection, count] of Object.entries(children)) {
    for (let index = 0; index < count; index += 1) batch.set(db().doc(`jobs/${created.job.id}/${collection}/d${String(index).padStart(4, '0')}`), { index });
  }
  await batch.commit();
  return created.job;
}

/** Puts the job in `status` by hand (not an ending: no marker), as the engine would have left it. */
async function putStatus(job: JobRecord, status: JobStatus, changes: Partial<JobRecord> = {}): Promise<JobRecord> {
  const next: JobRecord = { ...job, status, ...changes };
  await harness.store.jobRef(job.id).update(encodeJob(next));
  return next;
}

/** Ends a running job through the lifecycle table, in one conditioned commit, as the engine does. */
async function endThroughTable(job: JobRecord, how: 'complete' | 'fail' | 'cancel'): Promise<JobRecord> {
  await putStatus(job, 'running', { epoch: 1, lease: { epoch: 1, worker: 'w', expiresAtMs: harness.clock.now() + 60_000 } });
  const nowMs = harness.clock.now();
  await harness.store.transact(
    job.id,
    () => null,
    ({ job: current }) => {
      const error = { code: 'bad', message: 'no', retryable: false, atMs: nowMs };
      const transition =
        how === 'complete'
          ? completeJob(current, { outcome: 'complete', missing: [] }, nowMs)
          : how === 'fail'
            ? settleJobError(current, { decision: { action: 'fail', attempts: 1, reason: 'terminal' }, error }, nowMs)
            : cancelJobRecord(current, { cancellation: { atMs: nowMs, reason: 'stop', by: null, phase: null, sectionsDone: null, effects: null }, message: 'Cancelled', effectsToSettleAtMs: null }, nowMs);
      return Promise.resolve({ next: transition.next, events: transition.events, value: undefined });
    },
  );
  return readJob(job.id);
}

test('a completed research job: transcripts, events and drafts expire retentionDays after it ended; its document, answer, sections, checkpoints, units and claims do not', async () => {
  const jobId = await harness.submit('research', { question: 'How do leases and fencing tokens keep stale workers from corrupting results?', experts: 2, sections: 2, wordsPerSection: 60 });
  await harness.drain();
  const ended = await readJob(jobId);
  expect(ended.lastError).toBeNull();
  expect(ended).toMatchObject({ status: 'completed', retention: { dueAtMs: ended.finishedAtMs, cursor: null } });
  const endedAt = ended.finishedAtMs ?? 0;

  // Within the grace after the ending (a worker that had not heard of it may still be writing), nothing is stamped.
  harness.clock.advance(RETENTION_GRACE_MS - 60_000);
  const early = await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  expect(early.retention).toMatchObject({ jobsStamped: 0, documentsRead: 0, queryPages: 3 });
  expect((await readJob(jobId)).retention).toEqual({ dueAtMs: endedAt, cursor: null });

  const report = await sweepNow();

  expect(report.retention).toMatchObject({ jobsStamped: 1, jobsContinued: 0, jobsDeferred: 0, errors: 0, budgetSpent: false });
  const expireAt = endedAt + RETENTION_DAYS * DAY_MS;
  for (const collection of ['transcripts', 'events', 'drafts']) {
    const stamps = await expiries(jobId, collection);
    expect(stamps.length).toBeGreaterThan(0);
    expect(new Set(stamps)).toEqual(new Set([expireAt]));
  }
  for (const collection of ['results', 'sections', 'checkpoints', 'units', 'claims']) {
    const stamps = await expiries(jobId, collection);
    if (collection !== 'claims') expect(stamps.length).toBeGreaterThan(0);
    expect(stamps.filter((stamp) => stamp !== null)).toEqual([]);
  }
  const after = await harness.store.jobRef(jobId).get();
  expect(after.get(EXPIRE_AT)).toBeUndefined();
  expect(after.get('retention')).toBeNull();

  // Done means done: the next sweep finds nothing and writes nothing.
  const again = await sweepNow();
  expect(again.retention).toMatchObject({ jobsStamped: 0, documentsRead: 0, documentsStamped: 0 });
});

test('failed and cancelled jobs are stamped too (artifacts included); running, waiting and quarantined jobs are left alone', async () => {
  const failed = await endThroughTable(await jobWithChildren({ transcripts: 2, artifacts: 1, artifactChunks: 2 }), 'fail');
  const cancelled = await endThroughTable(await jobWithChildren({ transcripts: 1 }), 'cancel');
  const untouched = [
    await putStatus(await jobWithChildren({ transcripts: 2 }), 'running'),
    await putStatus(await jobWithChildren({ transcripts: 2 }), 'waiting', { waiting: { reason: 'decision', questionId: 'q', question: 'Go?', options: ['yes'], untilMs: null } }),
    await putStatus(await jobWithChildren({ transcripts: 2 }), 'quarantined', { quarantine: { reason: 'poison', atMs: harness.clock.now() }, finishedAtMs: harness.clock.now() }),
  ];

  const report = await sweepNow();

  expect(report.retention).toMatchObject({ jobsStamped: 2, errors: 0 });
  for (const job of [failed, cancelled]) {
    const expireAt = (job.finishedAtMs ?? 0) + RETENTION_DAYS * DAY_MS;
    for (const collection of ['transcripts', 'events', 'artifacts', 'artifactChunks']) for (const stamp of await expiries(job.id, collection)) expect(stamp).toBe(expireAt);
    expect((await readJob(job.id)).retention).toBeNull();
  }
  expect(await expiries(failed.id, 'artifactChunks')).toHaveLength(2);
  for (const job of untouched) {
    for (const collection of ['transcripts', 'events']) expect((await expiries(job.id, collection)).every((stamp) => stamp === null)).toBe(true);
  }
});

test("a job with more expiring documents than one sweep's bound keeps its marker, with a cursor, and the next sweep finishes it", async () => {
  const store = storeWith({ sweepBatchSize: BATCH });
  const job = await endThroughTable(await jobWithChildren({ transcripts: BOUND - 3, artifacts: 6, artifactChunks: 9 }), 'complete');
  const expireAt = (job.finishedAtMs ?? 0) + RETENTION_DAYS * DAY_MS;
  const total = async () => (await Promise.all(['transcripts', 'events', 'artifacts', 'artifactChunks'].map((collection) => expiries(job.id, collection)))).flat();
  expect((await total()).length).toBeGreaterThan(BOUND);

  const first = await sweepNow(store);

  expect(first.retention).toMatchObject({ jobsStamped: 0, jobsContinued: 1, budgetSpent: true, errors: 0 });
  expect(first.retention.documentsRead).toBeLessThanOrEqual(BOUND);
  const halfway = await readJob(job.id);
  expect(halfway.retention).toMatchObject({ dueAtMs: job.finishedAtMs });
  expect(halfway.retention?.cursor).toMatch(/^(events|artifacts)\//);
  const stampedFirst = (await total()).filter((stamp) => stamp === expireAt).length;
  expect(stampedFirst).toBeGreaterThan(0);
  expect(stampedFirst).toBeLessThan((await total()).length);

  const second = await sweepNow(store);

  expect(second.retention).toMatchObject({ jobsStamped: 1, jobsContinued: 0, errors: 0 });
  // It went on from the cursor: nothing stamped by the first sweep was read again.
  expect(second.retention.documentsRead + first.retention.documentsRead).toBe((await total()).length);
  expect(new Set(await total())).toEqual(new Set([expireAt]));
  expect((await readJob(job.id)).retention).toBeNull();
});

/** The same database, with `beforeCommit` run before every write batch's commit (the commit goes ahead unless it throws). */
function withBatchHook(beforeCommit: (commits: number) => Promise<void>): Firestore {
  return aroundBatchCommits(db(), async (commits, commit) => {
    await beforeCommit(commits);
    return commit();
  });
}

/** Every write batch after the first `allowed` fails its commit: a sweeper killed midway. */
function dyingAfter(allowed: number): Firestore {
  return withBatchHook((commits) => (commits > allowed ? Promise.reject(new Error('the sweeper was killed')) : Promise.resolve()));
}

test('a sweep killed after its first batch leaves the marker set, with the cursor that batch saved, and the next sweep completes the stamping', async () => {
  const job = await endThroughTable(await jobWithChildren({ transcripts: 3 * BATCH }), 'complete');
  const expireAt = (job.finishedAtMs ?? 0) + RETENTION_DAYS * DAY_MS;
  const warnings: string[] = [];

  const killed = await sweepNow(storeWith({ sweepBatchSize: BATCH }, dyingAfter(1)), (message) => warnings.push(message));

  expect(killed.retention).toMatchObject({ errors: 1, jobsStamped: 0, documentsStamped: BATCH });
  expect(warnings).toContain('retention: stamping a job failed');
  expect((await readJob(job.id)).retention).toEqual({ dueAtMs: job.finishedAtMs, cursor: `transcripts/d${String(BATCH - 1).padStart(4, '0')}` });
  const transcripts = await expiries(job.id, 'transcripts');
  expect(transcripts.filter((stamp) => stamp === expireAt)).toHaveLength(BATCH);
  expect(transcripts.filter((stamp) => stamp === null)).toHaveLength(2 * BATCH);

  const resumed = await sweepNow(storeWith({ sweepBatchSize: BATCH }));

  expect(resumed.retention).toMatchObject({ errors: 0, jobsStamped: 1, documentsStamped: 2 * BATCH + (await expiries(job.id, 'events')).length - 1 });
  expect(new Set(await expiries(job.id, 'transcripts'))).toEqual(new Set([expireAt]));
  expect(new Set(await expiries(job.id, 'events'))).toEqual(new Set([expireAt]));
  expect((await readJob(job.id)).retention).toBeNull();
});

test('a job written to while it is being stamped keeps its marker and gets no stamp (each page and the clearing commit are conditioned on its update time); the next sweep stamps it and clears it', async () => {
  const job = await endThroughTable(await jobWithChildren({ transcripts: 2 }), 'fail');
  const checkAtMs = harness.clock.now() + 3_600_000;
  const meddling = withBatchHook(async (commits) => {
    // Someone else's commit to the job (an effects check) lands while the first page is stamped.
    if (commits === 1) await harness.store.jobRef(job.id).update({ effectsToSettleAt: Timestamp.fromMillis(checkAtMs) });
  });

  const raced = await sweepNow(storeWith({}, meddling));

  expect(raced.retention).toMatchObject({ jobsDeferred: 1, jobsStamped: 0, documentsStamped: 0, errors: 0 });
  expect((await readJob(job.id)).retention).toEqual({ dueAtMs: job.finishedAtMs, cursor: null });
  expect((await readJob(job.id)).effectsToSettleAtMs).toBe(checkAtMs);
  expect(await expiries(job.id, 'transcripts')).toEqual([null, null]);

  const next = await sweepNow();

  expect(next.retention).toMatchObject({ jobsStamped: 1, errors: 0 });
  const expireAt = (job.finishedAtMs ?? 0) + RETENTION_DAYS * DAY_MS;
  for (const collection of ['transcripts', 'events']) expect(new Set(await expiries(job.id, collection))).toEqual(new Set([expireAt]));
  expect((await readJob(job.id)).retention).toBeNull();
  expect((await readJob(job.id)).effectsToSettleAtMs).toBe(checkAtMs);
});

test('an event written to a job after its stamping (an effects check of a stopped job) is stamped as it is written', async () => {
  const job = await endThroughTable(await jobWithChildren({ transcripts: 1 }), 'cancel');
  await sweepNow();
  expect((await readJob(job.id)).retention).toBeNull();

  harness.clock.advance(3_600_000);
  await harness.store.transact(job.id, () => null, ({ job: current }) =>
    Promise.resolve({ next: { ...current, effectsToSettleAtMs: null }, events: [{ kind: 'effects-reconciled', message: 'Checked 1 of 1 effects' }], value: undefined }),
  );

  const expireAt = (job.finishedAtMs ?? 0) + RETENTION_DAYS * DAY_MS;
  expect(new Set(await expiries(job.id, 'events'))).toEqual(new Set([expireAt]));
  expect((await readJob(job.id)).retention).toBeNull();
});

test("a job ended by a record built outside the table (a fan-out unit's failure) is marked by the store's commit all the same", async () => {
  const job = await putStatus(await jobWithChildren({ transcripts: 1 }), 'running', { epoch: 2, fanout: { phase: 'experts', epoch: 2, units: 1, done: 0, unitIds: ['u1'] } });
  const nowMs = harness.clock.now();
  await harness.store.transact(job.id, () => null, ({ job: current }) =>
    Promise.resolve({ next: { ...current, status: 'failed' as const, fanout: null, lease: null, finishedAtMs: nowMs }, events: [{ kind: 'failed', message: 'Failed: unit u1' }], value: undefined }),
  );
  expect((await readJob(job.id)).retention).toEqual({ dueAtMs: nowMs, cursor: null });

  await sweepNow();

  expect(new Set(await expiries(job.id, 'transcripts'))).toEqual(new Set([nowMs + RETENTION_DAYS * DAY_MS]));
});

test('a rejected task carries expireAt, retentionDays after it was recorded', async () => {
  const outcome = await runStep(harness.deps(), { jobId: 'no spaces allowed/here', step: -1 });
  expect(outcome.kind).toBe('rejected');

  const rejected = await db().collection('rejectedTasks').get();
  expect(rejected.size).toBe(1);
  const [doc] = rejected.docs;
  expect((doc?.get(EXPIRE_AT) as Timestamp).toMillis()).toBe((doc?.get('atMs') as number) + RETENTION_DAYS * DAY_MS);
  expect(doc?.get('atMs')).toBe(harness.clock.now());
});
