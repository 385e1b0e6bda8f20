/**
 * Re-drive on the official Firestore emulator: an operator restarts a completed, failed or
 * quarantined job from a named phase (engine/operator.ts redriveJob). What that phase and the later
 * ones stored (checkpoints, fan-out units, sections, transcripts) and the published answer are set
 * aside under `setAside`, readable and out of every read of the engine; the re-run redoes exactly
 * those phases, resumes no old transcript, reuses no old unit, publishes once; the timeline says
 * who and why. Paging past one commit, an interrupted re-drive, and every refusal.
 */
import type { JobRecord } from '../../functions/src/core/job';
import { canaryPipeline } from '../../functions/src/pipelines/canary';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { OperatorActionRefusedError, redriveJob, releaseQuarantined, type RedriveOptions, type RedriveRequest } from '../../functions/src/engine/operator';
import { RETENTION_GRACE_MS } from '../../functions/src/engine/retention';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob, decodeUnit, encodeJob } from '../../functions/src/store/codec';
import { JobStore } from '../../functions/src/store/job-store';
import { resolveEngineOptions } from '../../functions/src/core/options';
import { jobPath, JOBS, messagePath } from '../../functions/src/store/paths';
import { SET_ASIDE } from '../../functions/src/store/phase-documents';
import { EXPIRE_AT, EXPIRING_JOB_COLLECTIONS } from '../../functions/src/store/retention';
import { dyingInsideItsChange } from '../support/dead-client';
import { engineSuite } from '../support/engine';
import { afterFirstGet, aroundBatchCommits, whileInterposed } from '../support/interpose';
import { behaviour, firstPhase, testPipeline } from '../support/test-pipeline';

const pipelines = pipelineRegistry(testPipeline, canaryPipeline);

const harness = engineSuite('redrive', pipelines);

const db = () => harness.firestore.db;
const kinds = (outcomes: readonly { kind: string }[]) => outcomes.map((outcome) => outcome.kind);
const readJob = async (jobId: string): Promise<JobRecord> => decodeJob(jobId, (await db().doc(jobPath(jobId)).get()).data());
const ids = async (jobId: string, collection: string): Promise<string[]> => (await db().collection(`${JOBS}/${jobId}/${collection}`).get()).docs.map((doc) => doc.id).sort();
const events = async (jobId: string) =>
  (await db().collection(`${JOBS}/${jobId}/events`).get()).docs
    .map((doc) => ({ id: doc.id, kind: doc.get('kind') as string, message: doc.get('message') as string, status: doc.get('status') as string }))
    .sort((a, b) => a.id.localeCompare(b.id));

const request = (jobId: string, fromPhase: string, extra: Partial<RedriveRequest> = {}): RedriveRequest => ({ jobId, fromPhase, by: 'ops-ana', reason: 'the totals were computed wrong', ...extra });
const redrive = (jobId: string, fromPhase: string, options: Partial<RedriveOptions> = {}, extra: Partial<RedriveRequest> = {}) =>
  redriveJob(harness.store, harness.queue, request(jobId, fromPhase, extra), harness.clock.now(), { ...options, pipelines: options.pipelines ?? pipelines });

/** Rewrites a job document as the engine would have left it. */
async function rewriteJob(jobId: string, change: (job: JobRecord) => JobRecord): Promise<void> {
  const snapshot = await db().doc(jobPath(jobId)).get();
  await db().doc(jobPath(jobId)).set({ ...encodeJob(change(decodeJob(jobId, snapshot.data()))), requestFingerprint: snapshot.get('requestFingerprint') as string });
}

/**
 * The second phase: each section not yet recorded saves a transcript, then is recorded with
 * `valueOf(index)`; a transcript found before the save is a thread resumed (`resumed` notes it: a
 * re-driven section must start a fresh one). `onePerStep` yields after each section.
 */
function transcribedSections(resumed: string[], valueOf: (index: number) => number, { onePerStep = false } = {}): typeof behaviour.second {
  return async (context) => {
    const { sections: total } = context.checkpoint(firstPhase);
    const recorded = new Set(context.sections().map((section) => section.id));
    for (let index = 0; index < total; index += 1) {
      const id = `s${index}`;
      if (recorded.has(id)) continue;
      if ((await context.loadTranscript(id)) !== null) resumed.push(id);
      await context.saveTranscript(id, { messages: [{ role: 'user', content: `section ${id}` }] });
      behaviour.sectionRuns.set(id, (behaviour.sectionRuns.get(id) ?? 0) + 1);
      await context.recordSection(id, { value: valueOf(index) });
      if (onePerStep) return { kind: 'yield' };
    }
    return { kind: 'done', state: { total: context.sections().reduce((sum, section) => sum + (section.data as { value: number }).value, 0) } };
  };
}

/** A two-phase job run to completion, its second phase's sections saving a transcript each before they are recorded. */
async function completedTwoPhaseJob(sections: number, conversationId?: string): Promise<{ jobId: string; firstRuns: () => number; resumed: string[] }> {
  let firstRuns = 0;
  const resumed: string[] = [];
  behaviour.first = (context) => {
    firstRuns += 1;
    return Promise.resolve({ kind: 'done', state: { sections: context.input.sections } });
  };
  behaviour.second = transcribedSections(resumed, (index) => (index + 1) * (firstRuns + behaviour.publishes));
  const jobId = await harness.submit('two-phase', { sections }, 'user-1', conversationId);
  expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'completed']);
  return { jobId, firstRuns: () => firstRuns, resumed };
}

describe('a completed job re-driven from a phase', () => {
  test('sets that phase aside (checkpoint, sections, transcripts, the published answer), redoes it alone, and publishes once more', async () => {
    const { jobId, firstRuns, resumed } = await completedTwoPhaseJob(3);
    const before = await readJob(jobId);
    const firstAnswer = await db().doc(`${JOBS}/${jobId}/results/final`).get();
    expect(firstAnswer.get('markdown')).toBe('total 6');
    harness.clock.advance(60_000);

    const result = await redrive(jobId, 'second');
    const prefix = `r1e${before.epoch}~`;
    expect(result).toMatchObject({ enqueued: true, taskId: `${jobId}-s${before.step + 1}-d0`, setAside: 8, auditPrefix: prefix, resumesAt: 'second' });

    // Out of every place the engine reads, and kept, whole, for audit.
    expect(await ids(jobId, 'checkpoints')).toEqual(['first']);
    expect(await ids(jobId, 'sections')).toEqual([]);
    expect(await ids(jobId, 'transcripts')).toEqual([]);
    expect(await ids(jobId, 'results')).toEqual([]);
    expect(await ids(jobId, SET_ASIDE)).toEqual(
      [
        'checkpoints~second',
        'outbox~final',
        ...['s0', 's1', 's2'].map((id) => `sections~second~-~${id}`),
        ...['s0', 's1', 's2'].map((id) => `transcripts~second~-~${id}~000000`),
      ].map((id) => `${prefix}${id}`).sort(),
    );
    const asideAnswer = await db().doc(`${JOBS}/${jobId}/${SET_ASIDE}/${prefix}outbox~final`).get();
    expect(asideAnswer.get('markdown')).toBe('total 6');
    expect(asideAnswer.get('setAside')).toEqual({ redrive: 1, epoch: before.epoch, fromPhase: 'second', by: 'ops-ana', atMs: harness.clock.now(), collection: 'outbox', id: 'final', path: `${JOBS}/${jobId}/results/final` });
    expect((await db().doc(`${JOBS}/${jobId}/${SET_ASIDE}/${prefix}sections~second~-~s1`).get()).get('data')).toEqual({ value: 2 });

    const job = await readJob(jobId);
    expect(job).toMatchObject({ status: 'queued', phase: 'second', outcome: null, attempts: 0, staleReclaims: 0, finishedAtMs: null, retention: null, step: before.step + 1 });
    expect(job.redrive).toEqual({ count: 1, fromPhase: 'second', by: 'ops-ana', reason: 'the totals were computed wrong', atMs: harness.clock.now(), previousStatus: 'completed', setAside: 8, auditPrefix: prefix });
    const redriven = (await events(jobId)).find((event) => event.kind === 'redriven');
    expect(redriven?.status).toBe('queued');
    expect(redriven?.message).toMatch(/^Re-driven from second by ops-ana: the totals were computed wrong\. It was completed; 8 documents of second and later phases set aside/);

    // The re-run: the second phase alone, every section done again in a fresh thread, published once.
    expect(kinds(await harness.drain())).toEqual(['handed-off', 'completed']);
    expect(firstRuns()).toBe(1);
    expect(Object.fromEntries(behaviour.sectionRuns)).toEqual({ s0: 2, s1: 2, s2: 2 });
    expect(resumed).toEqual([]);
    expect(await ids(jobId, 'results')).toEqual(['final']);
    const answer = await db().doc(`${JOBS}/${jobId}/results/final`).get();
    expect(answer.get('markdown')).toBe('total 12');
    expect(answer.get('createdAtMs')).toBeGreaterThan(firstAnswer.get('createdAtMs') as number);
    expect(behaviour.publishes).toBe(2);
    const ended = await readJob(jobId);
    expect(ended).toMatchObject({ status: 'completed', outcome: 'complete' });
    expect(ended.retention?.dueAtMs).toBe(harness.clock.now());
    // The timeline reads straight through: completed, re-driven (queued), claimed, ..., completed.
    const timeline = await events(jobId);
    expect(timeline.map((event) => event.kind).slice(-6)).toEqual(['completed', 'redriven', 'claimed', 'checkpointed', 'claimed', 'completed']);
  });

  test('a duplicate of the completing step publishes nothing more: the outbox holds one answer', async () => {
    const { jobId } = await completedTwoPhaseJob(1);
    await redrive(jobId, 'first');
    expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'completed']);
    // Every step's task delivered again (Cloud Tasks may): nothing claims, nothing is published twice.
    const { step } = await readJob(jobId);
    for (let each = 0; each <= step; each += 1) harness.queue.tasks.push({ id: `again-${each}`, task: { jobId, step: each }, delaySeconds: 0 });
    expect(new Set(kinds(await harness.drain()))).toEqual(new Set(['not-claimable']));
    expect(await ids(jobId, 'results')).toEqual(['final']);
    expect(behaviour.publishes).toBe(2);
  });

  test('an answer published into a conversation is set aside with the rest, and the re-run publishes there again', async () => {
    const { jobId } = await completedTwoPhaseJob(1, 'conv-1');
    const result = await redrive(jobId, 'second');
    expect((await db().doc(messagePath('conv-1', jobId)).get()).exists).toBe(false);
    expect((await db().doc(`${JOBS}/${jobId}/${SET_ASIDE}/${result.auditPrefix}outbox~${jobId}`).get()).get('setAside.path')).toBe(messagePath('conv-1', jobId));
    await harness.drain();
    expect((await db().doc(messagePath('conv-1', jobId)).get()).get('markdown')).toBe('total 2');
  });

  test('re-driven twice: each re-drive numbers what it set aside, and the timeline keeps both', async () => {
    const { jobId } = await completedTwoPhaseJob(1);
    const first = await redrive(jobId, 'second');
    await harness.drain();
    const second = await redrive(jobId, 'first', {}, { by: 'ops-bo', reason: 'again' });
    expect(first.auditPrefix).toMatch(/^r1e\d+~$/);
    expect(second.auditPrefix).toMatch(/^r2e\d+~$/);
    expect(second.job.redrive).toMatchObject({ count: 2, by: 'ops-bo', fromPhase: 'first' });
    expect((await ids(jobId, SET_ASIDE)).filter((id) => id.startsWith(second.auditPrefix))).toHaveLength(5);
    expect((await events(jobId)).filter((event) => event.kind === 'redriven')).toHaveLength(2);
    await harness.drain();
    expect((await readJob(jobId)).status).toBe('completed');
  });
});

describe('a fan-out phase re-driven', () => {
  const text = 'One two three.\n\nFour five.\n\nSix.';

  test('its units are parked without their results (kept for audit), re-run under new claims, their cost counted once', async () => {
    const jobId = await harness.submit('canary', { text }, 'user-1');
    await harness.drain();
    expect((await readJob(jobId)).status).toBe('completed');
    const unitsBefore = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs.map((doc) => decodeUnit(doc.ref.path, doc.data()));
    expect(unitsBefore.map((unit) => [unit.unit, unit.status, unit.epoch])).toEqual([['p00', 'done', 1], ['p01', 'done', 1], ['p02', 'done', 1]]);

    const result = await redrive(jobId, 'measure');
    expect(await ids(jobId, 'checkpoints')).toEqual(['split']);
    const parked = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs.map((doc) => decodeUnit(doc.ref.path, doc.data()));
    for (const unit of parked) expect(unit).toMatchObject({ status: 'running', lease: null, result: null, epoch: 1, lastError: { code: 'set-aside' } });
    const aside = await db().doc(`${JOBS}/${jobId}/${SET_ASIDE}/${result.auditPrefix}units~measure~p01`).get();
    expect(aside.get('result')).toMatchObject({ words: 2, sentences: 1 });
    expect(aside.get('status')).toBe('done');
    // 3 units, 2 checkpoints (measure, summarize), 3 summary sections, the answer.
    expect(result.setAside).toBe(9);

    expect(kinds(await harness.drain())).toContain('completed');
    const unitsAfter = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs.map((doc) => decodeUnit(doc.ref.path, doc.data()));
    // A new claim number: a worker of the set-aside run can never pass for one of the re-run.
    expect(unitsAfter.map((unit) => [unit.unit, unit.status, unit.epoch])).toEqual([['p00', 'done', 2], ['p01', 'done', 2], ['p02', 'done', 2]]);
    expect((await db().doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown')).toContain('3 paragraphs, 6 words.');
  });

  test('a job quarantined in its fan-out is re-driven from it: the fan-out ends, its units are parked, and it runs again', async () => {
    const jobId = await harness.submit('canary', { text }, 'user-1');
    expect(kinds(await harness.drain(2))).toEqual(['handed-off', 'fanned-out']);
    const nowMs = harness.clock.now();
    await rewriteJob(jobId, (job) => ({ ...job, status: 'quarantined', quarantine: { reason: 'unit p01: its lease expired 4 times', atMs: nowMs }, finishedAtMs: nowMs }));
    expect((await readJob(jobId)).fanout?.unitIds).toEqual(['p00', 'p01', 'p02']);
    // One unit still held by a worker: its claim slot is revoked both as the fan-out ends and as the unit is parked.
    const unitRef = harness.store.unitRef(jobId, 'measure', 'p01');
    const held = decodeUnit(unitRef.path, (await unitRef.get()).data());
    await unitRef.set({ ...(await unitRef.get()).data(), status: 'running', epoch: 1, lease: { epoch: 1, worker: 'w-stuck', expiresAt: (await unitRef.get()).get('nextRunAt') as unknown, renewedAt: null } });
    await harness.store.claimSlotRef(jobId, 'measure~p01').set({ epoch: 1, state: 'held', worker: 'w-stuck', atMs: nowMs });
    expect(held.status).toBe('queued');
    harness.queue.drain();

    const result = await redrive(jobId, 'measure');
    expect(result).toMatchObject({ setAside: 3, resumesAt: 'measure' });
    expect(result.job).toMatchObject({ status: 'queued', fanout: null, quarantine: null });
    expect(kinds(await harness.drain())).toContain('completed');
    expect((await readJob(jobId)).status).toBe('completed');
  });

  test('from a later phase while an earlier one never finished: it resumes at the earlier one, and says so', async () => {
    const jobId = await harness.submit('canary', { text }, 'user-1');
    expect(kinds(await harness.drain(2))).toEqual(['handed-off', 'fanned-out']);
    const nowMs = harness.clock.now();
    await rewriteJob(jobId, (job) => ({ ...job, status: 'failed', fanout: null, lastError: { code: 'terminal', message: 'a bug', retryable: false, atMs: nowMs }, finishedAtMs: nowMs }));
    harness.queue.drain();
    const result = await redrive(jobId, 'summarize');
    expect(result).toMatchObject({ resumesAt: 'measure', setAside: 0 });
    expect(result.job.phase).toBe('measure');
    const redriven = (await events(jobId)).find((event) => event.kind === 'redriven');
    expect(redriven?.message).toContain('It was failed (a bug); 0 documents of summarize and later phases set aside for audit');
    expect(redriven?.message).toContain('it resumes at measure, an earlier phase it never finished');
    await harness.drain();
    expect((await readJob(jobId)).status).toBe('completed');
  });
});

describe('more than one commit holds', () => {
  test('a re-drive whose client dies inside its last commit (documents read, commit never sent) holds nothing: run again it lands at once, each document set aside once', async () => {
    const { jobId } = await completedTwoPhaseJob(3);
    const dying = dyingInsideItsChange(harness.store);
    void redriveJob(dying.store, harness.queue, request(jobId, 'second'), harness.clock.now(), { pipelines });
    await dying.decided;

    const result = await redrive(jobId, 'second');

    // 1 checkpoint, 3 sections, 3 transcripts and the answer.
    expect(result).toMatchObject({ setAside: 8, enqueued: true });
    expect(await ids(jobId, SET_ASIDE)).toHaveLength(8);
    expect((await readJob(jobId)).status).toBe('queued');
    expect((await events(jobId)).filter((event) => event.kind === 'redriven')).toHaveLength(1);
  });

  test('set aside in pages, the last phase first, and the job moved by the last commit only', async () => {
    const { jobId } = await completedTwoPhaseJob(5);
    // 1 checkpoint, 5 sections, 5 transcripts and the answer, two documents a commit.
    const result = await redrive(jobId, 'second', { pageSize: 2 });
    expect(result.setAside).toBe(12);
    expect(await ids(jobId, SET_ASIDE)).toHaveLength(12);
    expect(await ids(jobId, 'sections')).toEqual([]);
    expect((await events(jobId)).filter((event) => event.kind === 'redriven')).toHaveLength(1);
    await harness.drain();
    expect((await readJob(jobId)).status).toBe('completed');
  });

  test('an interrupted re-drive leaves the job as it was; run again it finishes; another phase is refused until then', async () => {
    const { jobId } = await completedTwoPhaseJob(5);
    const before = await readJob(jobId);
    let commits = 0;
    const interrupted: JobStore = Object.create(harness.store) as JobStore;
    const apply: JobStore['apply'] = (owner, decide) => {
      commits += 1;
      if (commits === 3) return Promise.reject(new Error('the connection was reset (injected)'));
      return harness.store.apply(owner, decide);
    };
    interrupted.apply = apply;
    await expect(redriveJob(interrupted, harness.queue, request(jobId, 'first'), harness.clock.now(), { pipelines, pageSize: 2 })).rejects.toThrow('injected');

    // Two pages went through, from the last phase: the job itself has not moved.
    const job = await readJob(jobId);
    expect(job).toMatchObject({ status: 'completed', step: before.step, epoch: before.epoch });
    expect(await ids(jobId, SET_ASIDE)).toHaveLength(4);
    expect(await ids(jobId, 'checkpoints')).toEqual(['first']);
    expect(harness.queue.tasks).toHaveLength(0);

    const other = redrive(jobId, 'second');
    await expect(other).rejects.toThrow(OperatorActionRefusedError);
    await expect(other).rejects.toThrow(`An interrupted re-drive of job ${jobId} from first already set some of its documents aside (setAside/r1e${before.epoch}~…); run it again from first to finish it.`);

    const finished = await redrive(jobId, 'first', { pageSize: 2 });
    // 2 checkpoints, 5 sections, 5 transcripts, the answer: every one counted once.
    expect(finished.setAside).toBe(13);
    expect(await ids(jobId, SET_ASIDE)).toHaveLength(13);
    expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'completed']);
  });

  test('a job that changes between two pages (run and ended again under another attempt) stops the re-drive: nothing more is set aside', async () => {
    const { jobId } = await completedTwoPhaseJob(5);
    let commits = 0;
    const racing: JobStore = Object.create(harness.store) as JobStore;
    const apply: JobStore['apply'] = async (owner, decide) => {
      commits += 1;
      // Before the second page: someone else's re-drive ran and the job ended again (a new epoch).
      if (commits === 2 && owner.kind === 'job-record') await rewriteJob(owner.jobId, (job) => ({ ...job, epoch: job.epoch + 1 }));
      return harness.store.apply(owner, decide);
    };
    racing.apply = apply;
    const attempt = redriveJob(racing, harness.queue, request(jobId, 'second'), harness.clock.now(), { pipelines, pageSize: 2 });
    await expect(attempt).rejects.toThrow(`Job ${jobId} changed while it was being re-driven (it is completed at epoch`);
    expect(await ids(jobId, SET_ASIDE)).toHaveLength(2);
    expect((await readJob(jobId)).status).toBe('completed');
    expect(harness.queue.tasks).toHaveLength(0);
  });
});

describe('refusals: nothing is written', () => {
  async function expectRefused(jobId: string, fromPhase: string, message: string, extra: Partial<RedriveRequest> = {}) {
    const before = (await db().doc(jobPath(jobId)).get()).updateTime;
    const attempt = redrive(jobId, fromPhase, {}, extra);
    await expect(attempt).rejects.toThrow(OperatorActionRefusedError);
    await expect(attempt).rejects.toThrow(message);
    expect((await db().doc(jobPath(jobId)).get()).updateTime?.isEqual(before!)).toBe(true);
    expect(await ids(jobId, SET_ASIDE)).toEqual([]);
    expect(harness.queue.tasks).toHaveLength(0);
  }

  test('an unknown phase names the phases there are', async () => {
    const { jobId } = await completedTwoPhaseJob(1);
    await expectRefused(jobId, 'third', 'Pipeline two-phase has no phase "third"; its phases are first, second.');
  });

  test('a queued, running or waiting job is still the engine\'s; a cancelled one was stopped by its owner', async () => {
    const jobId = await harness.submit('two-phase', { sections: 1 }, 'user-1');
    harness.queue.drain();
    await expectRefused(jobId, 'first', `Job ${jobId} is queued; only a completed, failed or quarantined job can be re-driven`);
    const nowMs = harness.clock.now();
    await rewriteJob(jobId, (job) => ({ ...job, status: 'running', epoch: 1, lease: { epoch: 1, worker: 'w', expiresAtMs: nowMs + 60_000 } }));
    await expectRefused(jobId, 'first', `Job ${jobId} is running;`);
    await rewriteJob(jobId, (job) => ({ ...job, status: 'waiting', lease: null, waiting: { reason: 'decision', questionId: 'q', question: 'Go on?', options: ['yes'], untilMs: null } }));
    await expectRefused(jobId, 'first', `Job ${jobId} is waiting;`);
    await rewriteJob(jobId, (job) => ({ ...job, status: 'cancelled', waiting: null, finishedAtMs: nowMs }));
    await expectRefused(jobId, 'first', `Job ${jobId} was cancelled by its owner; a re-drive would resume the work (and the effects) they stopped.`);
  });

  test('no reason, no operator, no such job', async () => {
    const { jobId } = await completedTwoPhaseJob(1);
    await expectRefused(jobId, 'first', 'A re-drive says why (reason', { reason: '  ' });
    await expectRefused(jobId, 'first', 'A re-drive names who makes it (by)', { by: '' });
    await expect(redrive('no-such-job', 'first')).rejects.toThrow('Job no-such-job does not exist.');
  });
});

describe('re-driven after the job first ended: the retention stamps on its timeline, a re-drive interrupted between its pages', () => {
  const DAY_MS = 86_400_000;

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
    const report = await whileInterposed(interposed, () => sweep({ store, queue: harness.queue, log: () => undefined }, harness.clock.now()));
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
    const passDb = aroundBatchCommits(db(), async (commit, landed) => {
      commits = commit;
      const results = await landed();
      if (commit === 1) await redrive(jobId, 'second');
      return results;
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
    behaviour.second = transcribedSections(resumed, (index) => index, { onePerStep: true });
    const jobId = await harness.submit('two-phase', { sections: 4 }, 'user-1');
    expect(kinds(await harness.drain(4))).toEqual(['handed-off', 'handed-off', 'handed-off', 'handed-off']); // first, s0, s1, s2
    harness.queue.drain();
    // Quarantined (its worker lost once too often) mid-second.
    const nowMs = harness.clock.now();
    await rewriteJob(jobId, (job) => ({ ...job, status: 'quarantined', lease: null, quarantine: { reason: 'lost its worker 4 times', atMs: nowMs }, finishedAtMs: nowMs }));

    // The operator re-drives from first; the connection drops after the first page.
    let commits = 0;
    const interrupted: JobStore = Object.create(harness.store) as JobStore;
    const apply: JobStore['apply'] = (owner, decide) => {
      commits += 1;
      if (commits === 2) return Promise.reject(new Error('the connection was reset (injected)'));
      return harness.store.apply(owner, decide);
    };
    interrupted.apply = apply;
    await expect(redriveJob(interrupted, harness.queue, request(jobId, 'first'), harness.clock.now(), { pipelines, pageSize: 2 })).rejects.toThrow('injected');
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
});
