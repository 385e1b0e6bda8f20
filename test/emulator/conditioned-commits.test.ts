/**
 * Job transitions as one commit conditioned on the job's update time: owner views remembered per
 * process, the claim slot's update time seeded into ClaimSession, transcripts and sections read
 * once per step by a document-ID range. Each test is named after an attack a hostile review made
 * on that change; `bug 17` and `bug 18` are the two it found (fixed), the rest it could not break.
 */
import { OwnershipLostError } from '../../functions/src/core/errors';
import { type JobRecord } from '../../functions/src/core/job';
import { pipelineRegistry, type PhaseOutcome, type StepContext } from '../../functions/src/core/pipeline';
import { claimJob, takeOverJob, TransitionRefused } from '../../functions/src/core/transitions';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob } from '../../functions/src/store/codec';
import type { JobClaim } from '../../functions/src/core/claims';
import { JobStore } from '../../functions/src/store/job-store';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite, gate } from '../support/engine';
import { behaviour, testPipeline, type TestInput } from '../support/test-pipeline';

const harness = engineSuite('review-conditioned', pipelineRegistry(testPipeline));

const db = () => harness.firestore.db;
const readJob = async (jobId: string): Promise<JobRecord> => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
/** A second process: its own JobStore (own owner views) over the same database and clock. */
const otherProcess = () => new JobStore(db(), harness.clock, harness.options);

async function submitQueued(): Promise<string> {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  harness.queue.drain();
  return jobId;
}

type Claimed = { job: JobRecord } | { reason: string };

/** What runJobStep's claim does (claim.ts), with an optional pause between decision and commit. */
function claim(store: JobStore, jobId: string, worker: string, pause?: () => Promise<void>): Promise<Claimed> {
  const nowMs = store.clock.now();
  return store.transact<Claimed>(jobId, () => null, async ({ job }) => {
    const input = { step: job.step, worker, options: store.options };
    let transition;
    try {
      transition = job.status === 'running' ? takeOverJob(job, input, nowMs) : claimJob(job, input, nowMs);
    } catch (error) {
      if (!(error instanceof TransitionRefused)) throw error;
      return { value: { reason: error.message } };
    }
    await pause?.();
    return { next: transition.next, events: transition.events, value: { job: transition.next } };
  });
}

async function claimOrThrow(store: JobStore, jobId: string, worker: string): Promise<JobClaim> {
  const claimed = await claim(store, jobId, worker);
  if (!('job' in claimed)) throw new Error(`not claimed: ${claimed.reason}`);
  return { jobId, epoch: claimed.job.epoch };
}

/** A holder's heartbeat as the flusher makes it: same record, fresh lease, optional notes. */
function heartbeat(store: JobStore, claimOf: JobClaim, notes: { kind: string; message: string }[] = []): Promise<void> {
  return store.asOwner(claimOf, ({ job }) =>
    Promise.resolve({
      next: { ...job, lease: job.lease && { ...job.lease, expiresAtMs: store.clock.now() + store.options.leaseSeconds * 1000, renewedAtMs: store.clock.now() } },
      events: notes,
      value: undefined,
    }),
  );
}

/** The lease runs out; one sweep (from `store`'s process) reclaims the job to queued at the next step. */
async function expireAndSweep(store: JobStore): Promise<void> {
  harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
  const report = await sweep({ store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  expect(report.reclaimed).toBe(1);
  harness.queue.drain();
}

async function eventDocs(jobId: string) {
  const snapshot = await db().collection(`${JOBS}/${jobId}/events`).get();
  return snapshot.docs.filter((doc) => doc.id.startsWith('j')).map((doc) => ({ id: doc.id, kind: doc.get('kind') as string, message: doc.get('message') as string }));
}

async function expectContiguousEvents(jobId: string): Promise<void> {
  const job = await readJob(jobId);
  const ids = (await eventDocs(jobId)).map((event) => event.id);
  expect(ids).toEqual(Array.from({ length: job.eventSeq }, (_, index) => `j${String(index + 1).padStart(8, '0')}`));
}

// ---- 1. The per-step transcript cache and the section range (document-ID range query) ------------

/**
 * Section and transcript IDs are any string a pipeline chooses (context.recordSection(id) and
 * saveTranscript(sectionId) take a plain string). IDs compare as UTF-8 bytes: a range ending at
 * prefix + U+F8FF missed an ID whose first character is above U+F8FF (an emoji, a full-width
 * letter), so the next step did not see it and redid the section, step after step.
 */
describe.each([
  ['an ASCII ID (control)', 's-1'],
  ['an emoji ID', '\u{1F680}-launch'],
  ['a full-width ID', '\uFF53\uFF11'],
])('resume after a yield with %s', (_label, sectionId) => {
  test('bug 17: the recorded section is loaded again and its work is not redone (checkpointed work is never redone)', async () => {
    const seen: { sections: string[]; transcript: unknown }[] = [];
    let runs = 0;
    behaviour.second = async (context: StepContext<TestInput>): Promise<PhaseOutcome<{ total: number }>> => {
      seen.push({ sections: context.sections().map((section) => section.id), transcript: await context.loadTranscript(`${sectionId}-next`) });
      if (!context.sections().some((section) => section.id === sectionId)) {
        runs += 1;
        await context.recordSection(sectionId, { value: 5 });
        // The next section is in flight when the step ends: its transcript is saved for the resume.
        await context.saveTranscript(`${sectionId}-next`, { turns: ['tool call t1 answered'] });
        return { kind: 'yield' };
      }
      return { kind: 'done', state: { total: 5 } };
    };
    await harness.submit('two-phase', { sections: 1 });
    // Bounded: with the section invisible, the phase redoes it and yields again, step after step.
    const outcomes = await harness.drain(6);
    // What the step after the yield saw: the recorded section, and the in-flight section's transcript.
    expect(seen[1]).toEqual({ sections: [sectionId], transcript: { turns: ['tool call t1 answered'] } });
    expect(runs).toBe(1);
    expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'handed-off', 'handed-off', 'completed']);
  });
});

// ---- 2. Zombie holder after a takeover ------------------------------------------------------------

/** A job claimed by worker-a in a process of its own, which heartbeats once (its owner view: its own last commit); then its lease expires, the sweeper reclaims it, and worker-b in another process claims it. */
async function takenOverAfterAHeartbeat() {
  const jobId = await submitQueued();
  const processA = otherProcess();
  const processB = otherProcess();
  const claimA = await claimOrThrow(processA, jobId, 'worker-a');
  await heartbeat(processA, claimA);
  await expireAndSweep(processB);
  const claimB = await claimOrThrow(processB, jobId, 'worker-b');
  return { jobId, processA, processB, claimA, claimB };
}

describe('a zombie holder whose owner view is cached', () => {
  test('in its own process: its hand-off with a checkpoint after the sweeper reclaimed and B claimed is refused, and leaves nothing', async () => {
    const { jobId, processA, claimA, claimB } = await takenOverAfterAHeartbeat(); // A's owner view: its own last commit
    const before = await readJob(jobId);

    await expect(
      processA.asOwner(claimA, ({ tx, job }) => {
        tx.set(processA.checkpointRef(jobId, 'first'), { phase: 'first', state: { sections: 1 }, epoch: claimA.epoch, recordedAtMs: 0 });
        return Promise.resolve({ next: { ...job, status: 'queued' as const, lease: null, step: job.step + 1 }, events: [{ kind: 'checkpointed', message: 'zombie' }], value: undefined });
      }),
    ).rejects.toBeInstanceOf(OwnershipLostError);
    expect((await processA.checkpointRef(jobId, 'first').get()).exists).toBe(false);
    expect(await readJob(jobId)).toEqual(before);
    expect(claimB.epoch).toBe(claimA.epoch + 1);
    await expectContiguousEvents(jobId);
  });

  test('in its own process: its first (seeded) owner write through the claim slot after the takeover is refused', async () => {
    const jobId = await submitQueued();
    const processA = otherProcess();
    const processB = otherProcess();
    const claimA = await claimOrThrow(processA, jobId, 'worker-a');
    const sessionA = processA.jobSession(claimA); // seeded with the claim commit's time: no read
    await expireAndSweep(processB);
    await claimOrThrow(processB, jobId, 'worker-b');
    const ref = db().doc(`${JOBS}/${jobId}/transcripts/zombie`);
    await expect(sessionA.commit('transcript', (batch) => batch.set(ref, { zombie: true }))).rejects.toBeInstanceOf(OwnershipLostError);
    expect((await ref.get()).exists).toBe(false);
  });

  test('sharing one JobStore with the new owner: its heartbeat is refused and the new owner keeps writing', async () => {
    const jobId = await submitQueued();
    const store = otherProcess();
    const claimA = await claimOrThrow(store, jobId, 'worker-a');
    await heartbeat(store, claimA);
    await expireAndSweep(store);
    const claimB = await claimOrThrow(store, jobId, 'worker-b');
    await expect(heartbeat(store, claimA, [{ kind: 'note', message: 'zombie' }])).rejects.toBeInstanceOf(OwnershipLostError);
    await heartbeat(store, claimB, [{ kind: 'note', message: 'B' }]);
    const sessionB = store.jobSession(claimB);
    await sessionB.commit('t', (batch) => batch.set(db().doc(`${JOBS}/${jobId}/transcripts/b`), { b: true }));
    const job = await readJob(jobId);
    expect(job).toMatchObject({ status: 'running', epoch: claimB.epoch });
    expect((await eventDocs(jobId)).filter((event) => event.message === 'zombie')).toEqual([]);
    await expectContiguousEvents(jobId);
  });

  test('a body that writes another document and returns no `next`: refused on a stale cached view, the document never lands', async () => {
    const { jobId, processA, claimA } = await takenOverAfterAHeartbeat();
    const ref = db().doc(`${JOBS}/${jobId}/checkpoints/first`);
    await expect(
      processA.asOwner(claimA, ({ tx }) => {
        tx.set(ref, { zombie: true });
        return Promise.resolve({ value: 'wrote' });
      }),
    ).rejects.toBeInstanceOf(OwnershipLostError);
    expect((await ref.get()).exists).toBe(false);
  });

  test('bug 18: asOwner with a body that writes nothing is still an ownership check (refused after a takeover)', async () => {
    const { processA, claimA } = await takenOverAfterAHeartbeat();
    // "refused unless the claim still holds": a caller probing its claim (or deciding from the job
    // record it is given) gets the cached record of a claim that is gone, with no read at all.
    await expect(processA.asOwner(claimA, ({ job }) => Promise.resolve({ value: job.epoch }))).rejects.toBeInstanceOf(OwnershipLostError);
  });
});

// ---- 3. Two claimers ---------------------------------------------------------------------------------

describe('two claimers that both decided from the same read', () => {
  test.each([
    ['in two processes', false],
    ['in one process (one JobStore)', true],
  ])('%s: exactly one wins; the other re-reads and is refused', async (_label, shared) => {
    const jobId = await submitQueued();
    const first = otherProcess();
    const second = shared ? first : otherProcess();
    // Both bodies decide before either commits: the pause holds each until both have decided.
    const bothDecided = gate();
    let decided = 0;
    const pause = async () => {
      decided += 1;
      if (decided === 2) bothDecided.open();
      await bothDecided.promise;
    };
    const results = await Promise.all([claim(first, jobId, 'worker-1', pause), claim(second, jobId, 'worker-2', pause)]);
    const winners = results.filter((result) => 'job' in result);
    expect(winners).toHaveLength(1);
    const job = await readJob(jobId);
    expect(job).toMatchObject({ status: 'running', epoch: 1 });
    const slot = await db().doc(`${JOBS}/${jobId}/claims/job`).get();
    expect(slot.data()).toMatchObject({ epoch: 1, state: 'held', worker: job.lease?.worker });
    expect((await eventDocs(jobId)).filter((event) => event.kind === 'claimed')).toHaveLength(1);
    await expectContiguousEvents(jobId);
    // The winner goes on writing (its view may have been dropped by the loser: one read, no loss).
    const winnerStore = job.lease?.worker === 'worker-1' ? first : second;
    const claimOf = { jobId, epoch: 1 };
    await heartbeat(winnerStore, claimOf);
    await winnerStore.jobSession(claimOf).commit('t', (batch) => batch.set(db().doc(`${JOBS}/${jobId}/transcripts/w`), { w: true }));
  });
});

// ---- 4. Events (IDs from the job's eventSeq) ------------------------------------------------------

describe('event IDs from a cached eventSeq', () => {
  test('a foreign commit adds events while the holder is cached: the holder re-decides, no event is overwritten or lost', async () => {
    const jobId = await submitQueued();
    const holder = otherProcess();
    const operator = otherProcess();
    const claimA = await claimOrThrow(holder, jobId, 'worker-a');
    await heartbeat(holder, claimA, [{ kind: 'note', message: 'holder-1' }]);
    // Someone else writes the job (still held by A) with an event of its own.
    await operator.transact(jobId, () => null, ({ job }) => Promise.resolve({ next: job, events: [{ kind: 'note', message: 'foreign' }], value: undefined }));
    await heartbeat(holder, claimA, [{ kind: 'note', message: 'holder-2' }]);
    const messages = (await eventDocs(jobId)).map((event) => event.message);
    expect(messages.filter((message) => ['holder-1', 'foreign', 'holder-2'].includes(message))).toEqual(['holder-1', 'foreign', 'holder-2']);
    await expectContiguousEvents(jobId);
  });

  test('a cancel lands between two heartbeats of a cached holder: the heartbeat is refused, the cancel and its events stand', async () => {
    const jobId = await submitQueued();
    const holder = otherProcess();
    const claimA = await claimOrThrow(holder, jobId, 'worker-a');
    await heartbeat(holder, claimA, [{ kind: 'note', message: 'holder-1' }]);
    await cancelJob(otherProcess(), { jobId, owner: 'user-1', reason: 'stop' });
    await expect(heartbeat(holder, claimA, [{ kind: 'note', message: 'holder-2' }])).rejects.toBeInstanceOf(OwnershipLostError);
    const job = await readJob(jobId);
    expect(job.status).toBe('cancelled');
    const kinds = (await eventDocs(jobId)).map((event) => event.kind);
    expect(kinds).toContain('cancelled');
    expect((await eventDocs(jobId)).map((event) => event.message)).not.toContain('holder-2');
    await expectContiguousEvents(jobId);
    const slot = await db().doc(`${JOBS}/${jobId}/claims/job`).get();
    expect(slot.get('state')).toBe('revoked');
  });
});

// ---- 5. The cached owner view and the slot seed -------------------------------------------------------

describe('the owner view and the slot seed', () => {
  test('no-op heartbeats (a frozen clock rewrites the same record): the holder keeps its claim, and a takeover still fences it', async () => {
    const jobId = await submitQueued();
    const holder = otherProcess();
    const claimA = await claimOrThrow(holder, jobId, 'worker-a');
    // Identical records: the clock does not move, nothing changes.
    await heartbeat(holder, claimA);
    await heartbeat(holder, claimA);
    await heartbeat(holder, claimA);
    const session = holder.jobSession(claimA);
    await session.commit('t', (batch) => batch.set(db().doc(`${JOBS}/${jobId}/transcripts/a`), { a: 1 }));
    const other = otherProcess();
    await expireAndSweep(other);
    await claimOrThrow(other, jobId, 'worker-b');
    await expect(heartbeat(holder, claimA)).rejects.toBeInstanceOf(OwnershipLostError);
    await expect(session.commit('t', (batch) => batch.set(db().doc(`${JOBS}/${jobId}/transcripts/a`), { a: 2 }))).rejects.toBeInstanceOf(OwnershipLostError);
    expect((await db().doc(`${JOBS}/${jobId}/transcripts/a`).get()).get('a')).toBe(1);
  });

  test('the owner view is what a read decodes: after heartbeats with notes and progress, the cached decision equals a fresh one', async () => {
    const jobId = await submitQueued();
    const holder = otherProcess();
    const claimA = await claimOrThrow(holder, jobId, 'worker-a');
    await holder.asOwner(claimA, ({ job }) => Promise.resolve({ next: { ...job, progress: { sectionsDone: 1 }, cost: { tokens: 0.1 + 0.2 } }, events: [{ kind: 'note', message: 'p' }], value: undefined }));
    let cached: JobRecord | null = null;
    await holder.asOwner(claimA, ({ job }) => {
      cached = job;
      return Promise.resolve({ value: undefined });
    });
    expect(cached).toEqual(await readJob(jobId));
  });

  test('a session made after the claim commit was followed by a slot revocation (cancel) fails its first, seeded write', async () => {
    const jobId = await submitQueued();
    const holder = otherProcess();
    const claimA = await claimOrThrow(holder, jobId, 'worker-a');
    await cancelJob(otherProcess(), { jobId, owner: 'user-1', reason: 'stop' });
    const session = holder.jobSession(claimA);
    const ref = db().doc(`${JOBS}/${jobId}/sections/first~-~x`);
    await expect(session.commit('section', (batch) => batch.create(ref, { x: 1 }))).rejects.toBeInstanceOf(OwnershipLostError);
    expect((await ref.get()).exists).toBe(false);
  });

  test('two claims of the same job in one process (take-over by a redelivered task): the old claim`s session seeded earlier cannot write', async () => {
    const jobId = await submitQueued();
    const store = otherProcess();
    const claimA = await claimOrThrow(store, jobId, 'worker-a');
    const sessionA = store.jobSession(claimA);
    // A goes silent past the stale-heartbeat threshold; its own step's task is redelivered here.
    harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
    const claimB = await claimOrThrow(store, jobId, 'worker-b');
    expect(claimB.epoch).toBe(claimA.epoch + 1);
    const sessionB = store.jobSession(claimB);
    const ref = db().doc(`${JOBS}/${jobId}/transcripts/t`);
    await expect(sessionA.commit('a', (batch) => batch.set(ref, { by: 'a' }))).rejects.toBeInstanceOf(OwnershipLostError);
    await sessionB.commit('b', (batch) => batch.set(ref, { by: 'b' }));
    await expect(heartbeat(store, claimA)).rejects.toBeInstanceOf(OwnershipLostError);
    expect((await ref.get()).get('by')).toBe('b');
  });
});

// ---- 6. A conditioned commit (the sweeper's reclaim) against an owner's reading transaction -------

describe('a reclaim by conditioned commit while the owner is inside a reading transaction', () => {
  test('the two serialize: the owner`s write (an effect entry) lands only if it commits before the reclaim', async () => {
    const jobId = await submitQueued();
    const holder = otherProcess();
    const claimA = await claimOrThrow(holder, jobId, 'worker-a');
    const inside = gate();
    const release = gate();
    const ref = db().doc(`${JOBS}/${jobId}/effects/fx_review`);
    const owned = holder
      .asOwnerReading(claimA, async ({ tx }) => {
        inside.open();
        await release.promise;
        tx.set(ref, { state: 'applying', epoch: claimA.epoch });
        return { value: 'recorded' };
      })
      .then(
        (value) => value,
        (error: unknown) => error,
      );
    await inside.promise;
    harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
    const sweeper = otherProcess();
    const swept = sweep({ store: sweeper, queue: harness.queue, log: () => undefined }, harness.clock.now());
    setTimeout(release.open, 500);
    const [ownerResult, report] = await Promise.all([owned, swept]);
    const job = await readJob(jobId);
    const jobSnapshot = await db().doc(`${JOBS}/${jobId}`).get();
    const effect = await ref.get();
    if (report.reclaimed === 1) {
      expect(job.status).toBe('queued');
      // Either the owner's transaction committed first (its write is older than the reclaim) or it was refused.
      if (effect.exists) {
        expect(ownerResult).toBe('recorded');
        expect(effect.updateTime?.toMillis()).toBeLessThanOrEqual(jobSnapshot.updateTime?.toMillis() ?? 0);
      } else {
        expect(ownerResult).toBeInstanceOf(OwnershipLostError);
      }
    } else {
      expect(ownerResult).toBe('recorded');
    }
  });
});
