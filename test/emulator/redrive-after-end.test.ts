/**
 * Re-drive against what the job left behind when it first ended (found by a hostile review): the
 * retention stamps the sweeper put on its timeline, and a re-drive interrupted between its pages.
 */
import type { WriteBatch } from 'firebase-admin/firestore';
import type { JobRecord } from '../../functions/src/core/job';
import { canaryPipeline } from '../../functions/src/pipelines/canary';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { redriveJob, releaseQuarantined } from '../../functions/src/engine/operator';
import { encodeJob } from '../../functions/src/store/codec';
import { RETENTION_GRACE_MS } from '../../functions/src/engine/retention';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob } from '../../functions/src/store/codec';
import { jobPath, JOBS } from '../../functions/src/store/paths';
import { EXPIRE_AT, EXPIRING_JOB_COLLECTIONS } from '../../functions/src/store/retention';
import { JobStore } from '../../functions/src/store/job-store';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { engineSuite } from '../support/engine';
import { afterFirstGet } from '../support/interpose';
import { behaviour, firstPhase, testPipeline } from '../support/test-pipeline';

const pipelines = pipelineRegistry(testPipeline, canaryPipeline);
const DAY_MS = 86_400_000;

const harness = engineSuite('redrive-after-end', pipelines);

const db = () => harness.firestore.db;
const kinds = (outcomes: readonly { kind: string }[]) => outcomes.map((outcome) => outcome.kind);
const readJob = async (jobId: string): Promise<JobRecord> => decodeJob(jobId, (await db().doc(jobPath(jobId)).get()).data());
const redrive = (jobId: string, fromPhase: string) =>
  redriveJob(harness.store, harness.queue, { jobId, fromPhase, by: 'ops-ana', reason: 'redo it' }, harness.clock.now(), { pipelines });

test('a job re-driven near the end of its retention runs again with none of its documents still set to expire (its timeline is not deleted under it)', async () => {
  const jobId = await harness.submit('two-phase', { sections: 2 }, 'user-1');
  expect(kinds(await harness.drain())).toContain('completed');
  const ended = await readJob(jobId);
  // The sweeper stamps the ended job's events (and transcripts, drafts, artifacts) with expireAt = end + 30 days.
  harness.clock.set(ended.finishedAtMs! + RETENTION_GRACE_MS + 1_000);
  await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  expect((await readJob(jobId)).retention).toBeNull();

  // Day 29 and a half: an operator re-drives it. README: "retention marker [is] cleared (the sweeper neither expires nor settles a job that runs again)".
  harness.clock.set(ended.finishedAtMs! + harness.options.retentionDays * DAY_MS - 12 * 3_600_000);
  await redrive(jobId, 'second');
  expect((await readJob(jobId)).status).toBe('queued');

  // Firestore's TTL deletes a document within a day of its expireAt: list what of this live job is due to go within the day.
  const dueWithinADay = (await db().collection(`${JOBS}/${jobId}/events`).get()).docs
    .filter((doc) => {
      const at = doc.get(EXPIRE_AT) as { toMillis(): number } | undefined;
      return at !== undefined && at.toMillis() <= harness.clock.now() + DAY_MS;
    })
    .map((doc) => doc.get('kind') as string);
  expect(dueWithinADay).toEqual([]);
});

test('bug 24: a re-drive that lands after the retention pass read the ended job leaves no expiry stamp on any page of the re-run job', async () => {
  const jobId = await harness.submit('two-phase', { sections: 2 }, 'user-1');
  expect(kinds(await harness.drain())).toContain('completed');
  const ended = await readJob(jobId);
  expect(ended.retention).toEqual({ dueAtMs: ended.finishedAtMs, cursor: null });
  harness.clock.set(ended.finishedAtMs! + RETENTION_GRACE_MS + 1_000);
  // Pages of 2, so the pass has several page commits to make after the re-drive.
  const store = new JobStore(db(), harness.clock, resolveEngineOptions({ ...harness.options, sweepBatchSize: 2 }));

  // The pass has read the job (ended, its stamping due); before it stamps a page, an operator re-drives
  // the job and its re-run takes its first step (a claim, events on the timeline).
  const interposed = afterFirstGet(db(), jobPath(jobId), async () => {
    await redrive(jobId, 'second');
    expect(kinds(await harness.drain(1))).toEqual(['handed-off']);
  });
  let report;
  try {
    report = await sweep({ store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  } finally {
    interposed.restore();
  }
  expect(interposed.ran()).toBe(true);

  const stamped: string[] = [];
  for (const collection of EXPIRING_JOB_COLLECTIONS) {
    for (const doc of (await db().collection(`${JOBS}/${jobId}/${collection}`).get()).docs) if (doc.get(EXPIRE_AT) !== undefined) stamped.push(`${collection}/${doc.id} (${String(doc.get('kind'))})`);
  }
  expect(stamped).toEqual([]);
  expect(report.retention).toMatchObject({ jobsStamped: 0, jobsDeferred: 1, documentsStamped: 0, errors: 0 });
  const rerun = await readJob(jobId);
  expect({ status: rerun.status, retention: rerun.retention }).toEqual({ status: 'queued', retention: null });
});

test('bug 24: a re-drive between two pages of the retention pass takes off the stamps the first page wrote, and the next page writes none', async () => {
  const jobId = await harness.submit('two-phase', { sections: 2 }, 'user-1');
  expect(kinds(await harness.drain())).toContain('completed');
  const ended = await readJob(jobId);
  harness.clock.set(ended.finishedAtMs! + RETENTION_GRACE_MS + 1_000);
  // The pass's database: once its first page of stamps has committed, the operator re-drives the job.
  let commits = 0;
  const passDb = new Proxy(db(), {
    get(target, property, receiver) {
      if (property !== 'batch') {
        const value: unknown = Reflect.get(target, property, receiver);
        return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
      }
      return (): WriteBatch => {
        const batch = target.batch();
        const commit = batch.commit.bind(batch);
        batch.commit = async () => {
          commits += 1;
          const results = await commit();
          if (commits === 1) await redrive(jobId, 'second');
          return results;
        };
        return batch;
      };
    },
  });
  const store = new JobStore(passDb, harness.clock, resolveEngineOptions({ ...harness.options, sweepBatchSize: 2 }));

  const report = await sweep({ store, queue: harness.queue, log: () => undefined }, harness.clock.now());

  expect(commits).toBe(2); // the first page's, then the second page's, which the re-drive's write to the job fails
  expect(report.retention).toMatchObject({ jobsStamped: 0, jobsDeferred: 1, documentsStamped: 2, errors: 0 });
  const stamped = (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.filter((doc) => doc.get(EXPIRE_AT) !== undefined).map((doc) => doc.id);
  expect(stamped).toEqual([]);
  expect((await readJob(jobId)).status).toBe('queued');
});

test('a re-drive interrupted between its pages: release is refused (it would run on half-set-aside state); the re-drive run again finishes it, redoing the phase with no old transcript', async () => {
  let firstRuns = 0;
  const resumed: string[] = [];
  behaviour.first = (context) => {
    firstRuns += 1;
    return Promise.resolve({ kind: 'done', state: { sections: context.input.sections } });
  };
  // One section a step, each saving a transcript before it is recorded.
  behaviour.second = async (context) => {
    const { sections: total } = context.checkpoint(firstPhase);
    const recorded = new Set(context.sections().map((section) => section.id));
    for (let index = 0; index < total; index += 1) {
      const id = `s${index}`;
      if (recorded.has(id)) continue;
      if ((await context.loadTranscript(id)) !== null) resumed.push(id);
      await context.saveTranscript(id, { messages: [{ role: 'user', content: `section ${id}` }] });
      await context.recordSection(id, { value: index });
      return { kind: 'yield' };
    }
    return { kind: 'done', state: { total: 0 } };
  };
  const jobId = await harness.submit('two-phase', { sections: 4 }, 'user-1');
  expect(kinds(await harness.drain(4))).toEqual(['handed-off', 'handed-off', 'handed-off', 'handed-off']); // first, s0, s1, s2
  harness.queue.drain();
  // Quarantined (its worker lost once too often) mid-second.
  const snapshot = await db().doc(jobPath(jobId)).get();
  const nowMs = harness.clock.now();
  const job = decodeJob(jobId, snapshot.data());
  await db().doc(jobPath(jobId)).set({ ...encodeJob({ ...job, status: 'quarantined', lease: null, quarantine: { reason: 'lost its worker 4 times', atMs: nowMs }, finishedAtMs: nowMs }), requestFingerprint: snapshot.get('requestFingerprint') as string });

  // The operator re-drives from first; the connection drops after the first page.
  let commits = 0;
  const interrupted: JobStore = Object.create(harness.store) as JobStore;
  const apply: JobStore['apply'] = (owner, decide) => {
    commits += 1;
    if (commits === 2) return Promise.reject(new Error('the connection was reset (injected)'));
    return harness.store.apply(owner, decide);
  };
  interrupted.apply = apply;
  await expect(redriveJob(interrupted, harness.queue, { jobId, fromPhase: 'first', by: 'ops-ana', reason: 'redo it' }, harness.clock.now(), { pipelines, pageSize: 2 })).rejects.toThrow('injected');
  expect((await readJob(jobId)).status).toBe('quarantined');

  // The console still offers release on a quarantined job; another operator presses it, and is refused with what to do.
  await expect(releaseQuarantined(harness.store, harness.queue, jobId, harness.clock.now(), () => undefined)).rejects.toThrow(
    /An interrupted re-drive of job \w+ from first already set some of its documents aside; run it again from first to finish it/,
  );
  expect((await readJob(jobId)).status).toBe('quarantined');
  await redrive(jobId, 'first');
  await harness.drain();
  // README (re-drive): the re-run "resumes no old transcript"; and the operator asked for `first` to be redone.
  expect({ status: (await readJob(jobId)).status, resumed, firstRuns }).toEqual({ status: 'completed', resumed: [], firstRuns: 2 });
});
