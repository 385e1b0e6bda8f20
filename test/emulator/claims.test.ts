/**
 * A job claim reads the stored checkpoints inside its decision (beside its
 * conditioned commit) instead of after it. Every write of a checkpoint rewrites the job under its
 * precondition, so a checkpoint that changes after the job read fails the claim's commit. But
 * `loadCheckpoints` reads more than checkpoints: when the phase the job resumes at is past
 * version 1, it also reads that phase's sections (the version check "before any new work"), and a
 * section write does NOT rewrite the job: a stale holder's section that lands between that read
 * and the claim's commit is missed. Before the change the read came after the commit, whose slot
 * write fenced the stale holder's section out.
 *
 * The other tests check the transact loop: the read used is the last decision's, and a read that
 * rejects in an abandoned attempt is neither an unhandled rejection nor a wrong outcome.
 */
import { type Query, type QuerySnapshot, type WriteBatch, type WriteResult, FieldValue, type DocumentReference, type DocumentSnapshot, type ReadOptions, type Timestamp } from 'firebase-admin/firestore';
import { z } from 'zod';
import { type JobRecord, stepTaskId, type StepTask } from '../../functions/src/core/job';
import { definePhase, definePipeline, pipelineRegistry, type PhaseOutcome, type PipelineRegistry, type StepContext } from '../../functions/src/core/pipeline';
import { checkpointDocumentFor } from '../../functions/src/engine/checkpoints';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { decodeJob } from '../../functions/src/store/codec';
import { checkpointPath, JOBS, jobPath } from '../../functions/src/store/paths';
import { engineHarness, gate, type EngineHarness, engineSuite } from '../support/engine';
import { behaviour, firstPhase, resetBehaviour, testPipelines, testPipeline } from '../support/test-pipeline';
import { OwnershipLostError } from '../../functions/src/core/errors';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { submitJob, type SubmitDeps } from '../../functions/src/engine/submit';
import { JobStore } from '../../functions/src/store/job-store';
import { heldUnitsPipeline, hold, unitFinished, type UnitInput } from '../support/held-units';
import type { RecordedTask } from '../support/task-queue';
import { losingCommitAnswers, type LostAnswerHeard, type LostCommitAnswers } from '../support/failures';
import { takeoverAgeMs } from '../../functions/src/core/options';

// ---- Two versions of one pipeline: version 2 of `items` refuses what version 1 recorded --------

type Input = { items: number };
const input = z.strictObject({ items: z.number().int().min(1).max(10) });
const count = definePhase<Input, { n: number }>({
  name: 'count',
  state: z.strictObject({ n: z.number().int() }),
  run: (context) => Promise.resolve({ kind: 'done', state: { n: context.input.items } }),
});

/** What the version 1 worker does in `items` (the test sets it); version 2's runs are counted. */
const v1Items: { run: (context: StepContext<Input>) => Promise<PhaseOutcome<{ total: number }>> } = {
  run: () => Promise.resolve({ kind: 'yield' }),
};
let v2Runs = 0;

const itemsV1 = definePhase<Input, { total: number }>({
  name: 'items',
  state: z.strictObject({ total: z.number().int() }),
  section: z.strictObject({ value: z.number().int() }),
  needs: [count],
  run: (context) => v1Items.run(context),
});
const REFUSAL = 'version 1 counted whole units';
const itemsV2 = definePhase<Input, { totalCents: number }>({
  name: 'items',
  version: 2,
  older: { 1: { refuse: REFUSAL } },
  state: z.strictObject({ totalCents: z.number().int() }),
  section: z.strictObject({ cents: z.number().int() }),
  needs: [count],
  run: async (context) => {
    // New work: a section of version 2 (a model call, an effect, in a real pipeline).
    v2Runs += 1;
    await context.recordSection(`s${context.sections().length}`, { cents: 100 });
    return { kind: 'yield' };
  },
});
const publish = () => ({ outcome: 'complete' as const, title: 'Total', markdown: 'done', missing: [] });
const V1: PipelineRegistry = pipelineRegistry(definePipeline<Input>({ name: 'versioned', description: 'v1', input, phases: [count, itemsV1], publish }));
const V2: PipelineRegistry = pipelineRegistry(definePipeline<Input>({ name: 'versioned', description: 'v2', version: 2, input, phases: [count, itemsV2], publish }));

let versions: EngineHarness;
let plain: EngineHarness;
beforeAll(() => {
  versions = engineHarness('claim-reads-versions', V1);
  plain = engineHarness('claim-reads-plain', testPipelines);
});
beforeEach(async () => {
  v2Runs = 0;
  v1Items.run = () => Promise.resolve({ kind: 'yield' });
  resetBehaviour();
  versions.queue.drain();
  plain.queue.drain();
  await Promise.all([versions.firestore.reset(), plain.firestore.reset()]);
});
afterEach(() => jest.restoreAllMocks());
afterAll(async () => {
  await versions.firestore.close();
  await plain.firestore.close();
});

const readJob = async (harness: EngineHarness, jobId: string): Promise<JobRecord> => decodeJob(jobId, (await harness.firestore.db.doc(jobPath(jobId)).get()).data());
const delay = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** The collection a query reads (the SDK keeps it on its query options). */
function queryTarget(query: Query): string {
  const options = (query as unknown as { _queryOptions: { parentPath: { relativeName: string }; collectionId: string } })._queryOptions;
  return `${options.parentPath.relativeName}/${options.collectionId}`;
}

/** Holds the next batch commit (only that one) until `release`; `held` resolves when it is being held. */
function holdNextCommit(db: FirebaseFirestore.Firestore) {
  const batchPrototype = Object.getPrototypeOf(db.batch()) as { commit: (this: WriteBatch) => Promise<WriteResult[]> };
  const commit = batchPrototype.commit;
  const held = gate();
  const released = gate();
  let armed = true;
  jest.spyOn(batchPrototype, 'commit').mockImplementation(async function (this: WriteBatch) {
    if (armed) {
      armed = false;
      held.open();
      await released.promise;
    }
    return commit.call(this);
  });
  return { held: held.promise, release: released.open };
}

/** Reports each answered query on `target` (after its answer arrived, before the caller sees it). */
function watchQueries(db: FirebaseFirestore.Firestore, target: string, onAnswer: (snapshot: QuerySnapshot) => Promise<void> | void) {
  const queryPrototype = Object.getPrototypeOf(db.collection('x').where('a', '==', 1)) as { get: (this: Query) => Promise<QuerySnapshot> };
  const get = queryPrototype.get;
  jest.spyOn(queryPrototype, 'get').mockImplementation(async function (this: Query) {
    const snapshot = await get.call(this);
    if (queryTarget(this) === target) await onAnswer(snapshot);
    return snapshot;
  });
}

test('a stale holder of version 1 records a section between the version check\'s sections read and the takeover\'s commit: version 2 must still refuse the job before any new work', async () => {
  const harness = versions;
  const db = harness.firestore.db;
  const jobId = await harness.submit('versioned', { items: 3 });
  // Step 0 on version 1: `count` checkpoints; the job resumes at `items` (version 2 there: its sections are checked on claim).
  const [countTask] = harness.queue.drain();
  expect((await runStep({ ...harness.deps('v1-a'), pipelines: V1 }, countTask!.task)).kind).toBe('handed-off');
  const [itemsTask] = harness.queue.drain();

  // A version 1 worker claims step 1 and goes quiet inside `items` (no heartbeat: stopped timers).
  const entered = gate();
  const recordNow = gate();
  const recorded = gate();
  const finishNow = gate();
  v1Items.run = async (context) => {
    entered.open();
    await recordNow.promise;
    await context.recordSection('s0', { value: 1 }).catch(() => undefined);
    recorded.open();
    await finishNow.promise;
    return { kind: 'yield' };
  };
  const stale = runStep({ ...harness.deps('v1-stale'), pipelines: V1 }, itemsTask!.task);
  await entered.promise;

  // Its heartbeat is stale: the redelivered task (on a version 2 worker) takes the step over.
  harness.clock.advance(takeoverAgeMs(harness.options) + 1_000);
  const sectionsRead = gate();
  watchQueries(db, `${JOBS}/${jobId}/sections`, () => sectionsRead.open());
  const commit = holdNextCommit(db);
  const takeover = runStep({ ...harness.deps('v2-b'), pipelines: V2 }, itemsTask!.task);
  await commit.held;
  // The version check's read of `items` sections, if it is made before the takeover commits.
  await Promise.race([sectionsRead.promise, delay(5_000)]);

  // The stale holder's section lands now: its slot has not been rewritten yet (the takeover has not committed).
  recordNow.open();
  await recorded.promise;
  const section = await db.doc(`${JOBS}/${jobId}/sections/items~-~s0`).get();
  expect(section.exists).toBe(true);
  expect(section.get('version')).toBe(1);

  commit.release();
  const outcome = await takeover;
  finishNow.open();
  expect((await stale).kind).toBe('ownership-lost');

  // The promise of the version check: a section version 2 refuses fails the job before any new work.
  expect(v2Runs).toBe(0);
  expect(outcome).toMatchObject({ kind: 'failed' });
  const job = await readJob(harness, jobId);
  expect(job.status).toBe('failed');
  expect(job.lastError?.message).toContain(REFUSAL);
});

test('a checkpoint (with its job rewrite) that lands after the first decision read the checkpoints: the retried claim reads them again and resumes after it', async () => {
  const harness = plain;
  const db = harness.firestore.db;
  let firstRuns = 0;
  // (The writer must change the job: a rewrite identical to the stored record leaves its update time as it was, and fences nothing.)
  behaviour.first = (context) => {
    firstRuns += 1;
    return Promise.resolve({ kind: 'done', state: { sections: context.input.sections } });
  };
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();

  const checkpointsRead = gate();
  watchQueries(db, `${JOBS}/${jobId}/checkpoints`, () => checkpointsRead.open());
  const commit = holdNextCommit(db);
  const claim = runStep(harness.deps('claimer'), task!.task);
  await commit.held;
  await checkpointsRead.promise;
  // Another writer checkpoints `first` and rewrites the job under its precondition (as every checkpoint writer does).
  harness.clock.advance(1);
  await harness.store.transact(jobId, () => null, ({ tx, job }) => {
    tx.set(db.doc(checkpointPath(jobId, 'first')), checkpointDocumentFor(firstPhase, { sections: 1 }, job.epoch, harness.clock.now()));
    return Promise.resolve({ next: job, value: undefined });
  });
  commit.release();
  const outcome: StepOutcome = await claim;

  // The first attempt's commit failed; the second decision read the checkpoints again and found `first`.
  expect(outcome).toMatchObject({ kind: 'handed-off', phase: 'second', checkpointed: true });
  expect(firstRuns).toBe(0);
  expect((await readJob(harness, jobId)).epoch).toBe(1);
});

test('a checkpoint read that rejects in an attempt whose commit then fails: no unhandled rejection, and the retried claim runs on its own read', async () => {
  const harness = plain;
  const db = harness.firestore.db;
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);
  process.on('unhandledRejection', onUnhandled);
  try {
    const jobId = await harness.submit('two-phase', { sections: 1 });
    const [task] = harness.queue.drain();
    const queryPrototype = Object.getPrototypeOf(db.collection('x').where('a', '==', 1)) as { get: (this: Query) => Promise<QuerySnapshot> };
    const get = queryPrototype.get;
    let failed = false;
    const touched = gate();
    jest.spyOn(queryPrototype, 'get').mockImplementation(async function (this: Query) {
      if (!failed && queryTarget(this) === `${JOBS}/${jobId}/checkpoints`) {
        failed = true;
        await touched.promise;
        throw Object.assign(new Error('9 FAILED_PRECONDITION: injected checkpoint read failure'), { code: 9 });
      }
      return get.call(this);
    });
    const commit = holdNextCommit(db);
    const claim = runStep(harness.deps('claimer'), task!.task);
    await commit.held;
    // Someone rewrites the job: the first attempt's commit fails and the claim decides again.
    await db.doc(jobPath(jobId)).update({ touchedByTest: 1 });
    touched.open();
    commit.release();
    const outcome = await claim;
    await delay(200);
    expect(failed).toBe(true);
    expect(outcome).toMatchObject({ kind: 'handed-off', phase: 'first', checkpointed: true });
    expect(unhandled).toEqual([]);
  } finally {
    process.off('unhandledRejection', onUnhandled);
  }
});

test('a checkpoint read that rejects in the attempt that commits: the step fails loudly with that error, never runs a phase on no checkpoints', async () => {
  const harness = plain;
  const db = harness.firestore.db;
  const jobId = await harness.submit('two-phase', { sections: 1 });
  await harness.drain(1);
  const [task] = harness.queue.drain();
  let firstRuns = 0;
  behaviour.first = () => {
    firstRuns += 1;
    return Promise.resolve({ kind: 'done', state: { sections: 1 } });
  };
  const queryPrototype = Object.getPrototypeOf(db.collection('x').where('a', '==', 1)) as { get: (this: Query) => Promise<QuerySnapshot> };
  const get = queryPrototype.get;
  jest.spyOn(queryPrototype, 'get').mockImplementation(async function (this: Query) {
    if (queryTarget(this) === `${JOBS}/${jobId}/checkpoints`) throw Object.assign(new Error('9 FAILED_PRECONDITION: injected checkpoint read failure'), { code: 9 });
    return get.call(this);
  });
  await expect(runStep(harness.deps('claimer'), task!.task)).rejects.toThrow(/injected checkpoint read failure/);
  expect(firstRuns).toBe(0);
  // The claim landed (as before the change): the job is held by the claimer, for a takeover or the sweeper.
  expect((await readJob(harness, jobId)).status).toBe('running');
});

/**
 * Unit claims and take-overs are conditioned commits (JobStore.commitUnitChange): a plain read of
 * the job, the unit and its claim slot, then one batch conditioned on them. Each test builds one
 * interleaving around that read and that commit: duplicate deliveries, cancels, take-overs racing
 * finishes, missing slots, quarantine; exactly one holder runs the unit, and no stale write lands.
 */
describe('unit claims racing: the claim read, its commit and the slot', () => {
  const { pipeline: units, turns } = heldUnitsPipeline('racing-units');

  const harness = engineSuite('unit-claim-races', pipelineRegistry(units), {
    beforeEach: () => {
      turns.reset();
    },
    afterEach: () => jest.restoreAllMocks(),
  });

  const db = () => harness.firestore.db;
  const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());

  async function fannedOut(count: number, legacy = false): Promise<{ jobId: string; tasks: RecordedTask[] }> {
    const jobId = await harness.submit('racing-units', { units: count });
    expect((await harness.drain(1)).map((o) => o.kind)).toEqual(['fanned-out']);
    const tasks = harness.queue.drain();
    if (legacy) await db().doc(`${JOBS}/${jobId}`).update({ 'fanout.unitIds': FieldValue.delete() });
    return { jobId, tasks };
  }

  function taskOf(tasks: readonly RecordedTask[], unit: string): RecordedTask {
    const task = tasks.find((candidate) => candidate.task.unit === unit);
    if (!task) throw new Error(`no task for ${unit}`);
    return task;
  }

  /** A late section from a holder that may have lost its claim: what became of it. */
  async function lateSection(context: StepContext<UnitInput>): Promise<unknown> {
    try {
      await context.recordSection('late', { value: 9 });
      return 'section committed';
    } catch (error) {
      return error instanceof OwnershipLostError ? 'OwnershipLostError' : error;
    }
  }

  /** The owner cancels (through a store of its own) right after the first claim read, before its commit. Answers whether it did. */
  function cancelAfterTheClaimRead(jobId: string): () => boolean {
    const canceller = new JobStore(db(), harness.clock, harness.options);
    let cancelled = false;
    interceptClaimReads(jobId, async () => {
      if (cancelled) return;
      cancelled = true;
      await cancelJob(canceller, { jobId, owner: 'user-1', reason: 'racing a claim' });
    });
    return () => cancelled;
  }

  /** Holds the first two claim reads that find the unit queued until both are made: two claimers decide from the same read. Answers how many such reads there were. */
  function bothReadTheQueuedUnit(jobId: string): () => number {
    const bothRead = gate();
    let queuedReads = 0;
    interceptClaimReads(jobId, async (status) => {
      if (status !== 'queued') return;
      queuedReads += 1;
      if (queuedReads === 2) bothRead.open();
      if (queuedReads <= 2) await bothRead.promise;
    });
    return () => queuedReads;
  }

  /** Calls `onClaimRead` after the claim's getAll (job, unit, slot) has read, before it returns. */
  function interceptClaimReads(jobId: string, onClaimRead: (unitStatus: unknown, index: number) => Promise<void>) {
    const getAll = db().getAll.bind(db());
    let index = 0;
    return jest.spyOn(db(), 'getAll').mockImplementation(async (...refs: (DocumentReference | ReadOptions)[]): Promise<DocumentSnapshot[]> => {
      const snapshots = await getAll(...refs);
      const paths = refs.map((ref) => ('path' in ref ? ref.path : ''));
      if (paths.length === 3 && paths[0] === `${JOBS}/${jobId}` && paths[1]?.includes('/units/') && paths[2]?.includes('/claims/')) {
        const at = index;
        index += 1;
        await onClaimRead(snapshots[1]?.get('status'), at);
      }
      return snapshots;
    });
  }

  /** Every unit finishes at once when run; returns the units run, in order. */
  function recordRuns(): string[] {
    const runs: string[] = [];
    turns.run = (_context, unit) => {
      runs.push(unit);
      return Promise.resolve({ kind: 'done', state: { value: 1 } });
    };
    return runs;
  }

  describe('unit claims as conditioned commits', () => {
    test('duplicate delivery: two claimers read the queued unit before either commits; exactly one runs the unit', async () => {
      const { jobId, tasks } = await fannedOut(1);
      const runs = recordRuns();
      const queuedReads = bothReadTheQueuedUnit(jobId);
      const task = taskOf(tasks, 'u0').task;
      const outcomes = await Promise.all([runStep(harness.deps('worker-a'), task), runStep(harness.deps('worker-b'), task)]);
      expect(queuedReads()).toBe(2);
      expect(runs).toEqual(['u0']);
      expect(outcomes.map((o) => o.kind).sort()).toEqual(['not-yet-due', 'unit-done'].sort());
    });

    test.each([
      ['fan-out with unit IDs', false],
      ['legacy fan-out without unit IDs', true],
    ])('a claim read before a cancel (%s) commits nothing after it', async (_kind, legacy) => {
      const { jobId, tasks } = await fannedOut(2, legacy);
      const runs = recordRuns();
      const cancelled = cancelAfterTheClaimRead(jobId);
      const outcome = await runStep(harness.deps('worker-a'), taskOf(tasks, 'u0').task);
      expect(cancelled()).toBe(true);
      expect((await readJob(jobId)).status).toBe('cancelled');
      expect(runs).toEqual([]);
      expect(outcome.kind).toBe('not-claimable');
    });

    test('the seeded session: its seed is the slot update time the claim wrote', async () => {
      const { jobId, tasks } = await fannedOut(1);
      const seeds: (Timestamp | null)[] = [];
      const unitSession = harness.store.unitSession.bind(harness.store);
      jest.spyOn(harness.store, 'unitSession').mockImplementation((claim, seed) => {
        seeds.push(seed ?? null);
        return unitSession(claim, seed);
      });
      let slotTime: Timestamp | undefined;
      turns.run = async (context) => {
        slotTime = (await db().doc(`${JOBS}/${jobId}/claims/experts~u0`).get()).updateTime;
        // The claim's first slot-fenced write opens its session.
        await context.recordSection('s0', { value: 1 });
        return { kind: 'done', state: { value: 1 } };
      };
      await runStep(harness.deps('worker-a'), taskOf(tasks, 'u0').task);
      expect(seeds).toHaveLength(1);
      expect(seeds[0]?.toMillis()).toBe(slotTime?.toMillis());
      expect(seeds[0]?.isEqual(slotTime as Timestamp)).toBe(true);
    });

    test('a take-over after the holder went silent: the old holder (seeded session, no write yet) can record nothing', async () => {
      const { jobId, tasks } = await fannedOut(1);
      const holdA = hold();
      const holdB = hold();
      const aWrites: unknown[] = [];
      let turn = 0;
      turns.run = async (context) => {
        turn += 1;
        if (turn === 1) {
          holdA.arrive();
          await holdA.released;
          aWrites.push(await lateSection(context));
          return { kind: 'done', state: { value: 1 } };
        }
        holdB.arrive();
        await holdB.released;
        return { kind: 'done', state: { value: 2 } };
      };
      const task = taskOf(tasks, 'u0').task;
      const a = runStep(harness.deps('worker-a'), task);
      await holdA.entered;
      harness.clock.advance(takeoverAgeMs(harness.options) + 1_000);
      const b = runStep(harness.deps('worker-b'), task);
      await holdB.entered;
      holdA.release();
      const aOutcome: StepOutcome = await a;
      expect(aWrites).toEqual(['OwnershipLostError']);
      expect(aOutcome.kind).toBe('ownership-lost');
      holdB.release();
      expect((await b).kind).toBe('unit-done');
      const sections = (await db().collection(`${JOBS}/${jobId}/sections`).get()).docs.map((doc) => doc.id);
      expect(sections.filter((id) => id.includes('late'))).toEqual([]);
    });

    for (const legacy of [false, true]) {
      test(`a take-over over the stale budget quarantines the job (${legacy ? 'legacy fan-out' : 'unit IDs'}); the old holder records nothing`, async () => {
        const { jobId, tasks } = await fannedOut(2, legacy);
        const holdA = hold();
        const aWrites: unknown[] = [];
        turns.run = async (context, unit) => {
          if (unit !== 'u0') return { kind: 'done', state: { value: 1 } };
          holdA.arrive();
          await holdA.released;
          aWrites.push(await lateSection(context));
          return { kind: 'done', state: { value: 1 } };
        };
        await db().doc(`${JOBS}/${jobId}/units/experts~u0`).update({ staleReclaims: harness.options.maxStaleReclaims });
        const task = taskOf(tasks, 'u0').task;
        const a = runStep(harness.deps('worker-a'), task);
        await holdA.entered;
        harness.clock.advance(takeoverAgeMs(harness.options) + 1_000);
        const b = await runStep(harness.deps('worker-b'), task);
        expect(b.kind).toBe('not-claimable');
        const job = await readJob(jobId);
        expect(job.status).toBe('quarantined');
        const slot = await db().doc(`${JOBS}/${jobId}/claims/experts~u0`).get();
        expect(slot.get('state')).toBe('revoked');
        holdA.release();
        const aOutcome = await a;
        expect(aWrites).toEqual(['OwnershipLostError']);
        expect(aOutcome.kind).toBe('ownership-lost');
        // The sibling's task runs nothing either.
        const c = await runStep(harness.deps('worker-c'), taskOf(tasks, 'u1').task);
        expect(c.kind).toBe('not-claimable');
      });
    }
  });

  describe('take-over racing a finish', () => {
    test('the holder read for its finish, then a take-over committed: the finish lands nothing, the job joins once (by the taker)', async () => {
      const { jobId, tasks } = await fannedOut(1);
      const holdA = hold();
      const holdB = hold();
      let turn = 0;
      turns.run = async () => {
        turn += 1;
        const mine = turn === 1 ? holdA : holdB;
        mine.arrive();
        await mine.released;
        return { kind: 'done', state: { value: turn === 1 ? 1 : 2 } };
      };
      const task = taskOf(tasks, 'u0').task;
      const a = runStep(harness.deps('worker-a'), task);
      await holdA.entered;
      harness.clock.advance(takeoverAgeMs(harness.options) + 1_000);
      let b: Promise<StepOutcome> | null = null;
      let inside = false;
      interceptClaimReads(jobId, async (status) => {
        if (inside || b !== null || status !== 'running') return;
        inside = true;
        b = runStep(harness.deps('worker-b'), task);
        await holdB.entered;
        inside = false;
      });
      holdA.release();
      const aOutcome = await a;
      expect(b).not.toBeNull();
      expect(aOutcome.kind).toBe('ownership-lost');
      holdB.release();
      const bOutcome = await (b as unknown as Promise<StepOutcome>);
      expect(bOutcome).toMatchObject({ kind: 'unit-done', joined: true });
      expect((await db().doc(`${JOBS}/${jobId}/checkpoints/experts`).get()).exists).toBe(true);
      const job = await readJob(jobId);
      expect(job.fanout).toBeNull();
    });

    test('a take-over read before the holder finished: the take-over lands nothing after the finish', async () => {
      const { jobId, tasks } = await fannedOut(1);
      const holdA = hold();
      let turn = 0;
      turns.run = async () => {
        turn += 1;
        if (turn === 1) {
          holdA.arrive();
          await holdA.released;
        }
        return { kind: 'done', state: { value: turn } };
      };
      const task = taskOf(tasks, 'u0').task;
      const a = runStep(harness.deps('worker-a'), task);
      await holdA.entered;
      harness.clock.advance(takeoverAgeMs(harness.options) + 1_000);
      let aOutcome: StepOutcome | null = null;
      let first = true;
      interceptClaimReads(jobId, async (status) => {
        if (!first || status !== 'running') return;
        first = false;
        holdA.release();
        aOutcome = await a;
      });
      const bOutcome = await runStep(harness.deps('worker-b'), task);
      expect(aOutcome).toMatchObject({ kind: 'unit-done', joined: true });
      expect(bOutcome.kind).toBe('not-claimable');
      expect(turn).toBe(1);
    });
  });

  describe('units whose claim slot is missing (from before claim slots)', () => {
    test('two claimers both see no slot: one creates it and runs, the other reads again and stands back; the seed is the created slot time', async () => {
      const { jobId, tasks } = await fannedOut(1);
      await db().doc(`${JOBS}/${jobId}/claims/experts~u0`).delete();
      const runs: string[] = [];
      let slotTime: Timestamp | undefined;
      turns.run = async (context, unit) => {
        runs.push(unit);
        slotTime = (await db().doc(`${JOBS}/${jobId}/claims/experts~u0`).get()).updateTime;
        // The claim's first slot-fenced write opens its session.
        await context.recordSection('s0', { value: 1 });
        return { kind: 'done', state: { value: 1 } };
      };
      const seeds: (Timestamp | null)[] = [];
      const unitSession = harness.store.unitSession.bind(harness.store);
      jest.spyOn(harness.store, 'unitSession').mockImplementation((claim, seed) => {
        seeds.push(seed ?? null);
        return unitSession(claim, seed);
      });
      bothReadTheQueuedUnit(jobId);
      const task = taskOf(tasks, 'u0').task;
      const outcomes = await Promise.all([runStep(harness.deps('worker-a'), task), runStep(harness.deps('worker-b'), task)]);
      expect(runs).toEqual(['u0']);
      expect(outcomes.map((o) => o.kind).sort()).toEqual(['not-yet-due', 'unit-done']);
      expect(seeds).toHaveLength(1);
      expect(seeds[0]?.isEqual(slotTime as Timestamp)).toBe(true);
    });

    test('no slot, a cancel lands between the claim read and its commit: nothing runs', async () => {
      const { jobId, tasks } = await fannedOut(2);
      await db().doc(`${JOBS}/${jobId}/claims/experts~u0`).delete();
      const runs = recordRuns();
      cancelAfterTheClaimRead(jobId);
      const outcome = await runStep(harness.deps('worker-a'), taskOf(tasks, 'u0').task);
      expect((await readJob(jobId)).status).toBe('cancelled');
      expect(runs).toEqual([]);
      expect(outcome.kind).toBe('not-claimable');
    });
  });
});

/**
 * Commits that land while their answer is lost: the writer must find out that its commit is in and
 * go on from it. A claim must not turn into a lost worker at its redelivery, and a hand-off, a
 * fan-out start or a join must still dispatch what it started, not leave it to the sweeper a grace
 * period later. Two ways the writer hears of it (LostAnswerHeard): the UNAVAILABLE itself (bug 27),
 * or, as the Firestore SDK really answers a Commit whose connection was reset after it landed, its
 * own retry's FAILED_PRECONDITION or ALREADY_EXISTS (bug 45: the commit-answer-lost fault's
 * recoveries of 20 to 35 s in the soak, each a landed hand-off, fan-out start or join taken for a
 * lost claim, its task left to the sweeper's lost-task grace).
 */
function lostAnswerCases(heard: LostAnswerHeard, bug: string): void {
  describe(`a claim or a commit whose answer is lost on its way back (heard as ${heard})`, () => {
    const held = heldUnitsPipeline(`lost-answer-units-${heard}`);
    let answers: LostCommitAnswers;

    const harness = engineSuite(`lost-answers-${heard}`, pipelineRegistry(testPipeline, held.pipeline), {
      beforeEach: () => {
        held.turns.reset();
        answers = losingCommitAnswers(harness.firestore.db, heard);
      },
      afterEach: () => answers.restore(),
    });

    const db = () => harness.firestore.db;
    const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
    const eventKinds = (jobId: string) => harness.eventKinds(jobId);
    const kinds = (outcomes: readonly StepOutcome[]) => outcomes.map((outcome) => outcome.kind);

    /** One task as Cloud Tasks delivers it: an answer "not yet due" is delivered again once that time has passed (a few times at most). */
    async function deliver(task: StepTask): Promise<StepOutcome[]> {
      const outcomes: StepOutcome[] = [];
      for (let delivery = 0; delivery < 4; delivery += 1) {
        const outcome = await runStep(harness.deps(`worker-${delivery}`), task);
        outcomes.push(outcome);
        if (outcome.kind !== 'not-yet-due') return outcomes;
        harness.clock.advance(outcome.retryAfterMs);
      }
      return outcomes;
    }

    function nextTask(): StepTask {
      const next = harness.queue.tasks.shift();
      if (!next) throw new Error('no task was dispatched');
      harness.clock.advance(next.delaySeconds * 1000);
      return next.task;
    }

    describe('a claim whose answer is lost', () => {
      test(`${bug} the step goes on under the claim it made; four in one section count no lost worker and do not quarantine the job`, async () => {
        let firstRuns = 0;
        behaviour.first = (context): Promise<PhaseOutcome<{ sections: number }>> => {
          firstRuns += 1;
          return Promise.resolve(firstRuns <= 4 ? { kind: 'yield' } : { kind: 'done', state: { sections: context.input.sections } });
        };
        const jobId = await harness.submit('two-phase', { sections: 1 });
        const deliveries: string[][] = [];
        for (let step = 0; step < 4; step += 1) {
          answers.arm(1); // the claim is the step's first commit
          deliveries.push(kinds(await deliver(nextTask())));
        }
        expect(answers.lost()).toBe(4);
        const afterFour = await readJob(jobId);
        expect({ deliveries, status: afterFour.status, staleReclaims: afterFour.staleReclaims }).toEqual({
          deliveries: [['handed-off'], ['handed-off'], ['handed-off'], ['handed-off']],
          status: 'queued',
          staleReclaims: 0,
        });
        expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'completed']);
        expect((await eventKinds(jobId)).filter((kind) => kind === 'reclaimed' || kind === 'quarantined')).toEqual([]);
      });

      test(`${bug} a unit's claim: the unit runs under the claim it made and counts no lost worker`, async () => {
        const jobId = await harness.submit(`lost-answer-units-${heard}`, { units: 1 });
        expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);
        answers.arm(1);
        const unitTask = nextTask();
        expect(kinds(await deliver(unitTask))).toEqual(['unit-done']);
        expect(answers.lost()).toBe(1);
        expect(kinds(await harness.drain())).toEqual(['completed']);
        expect((await eventKinds(jobId)).filter((kind) => kind === 'reclaimed' || kind === 'quarantined')).toEqual([]);
        const units = await db().collection(`${JOBS}/${jobId}/units`).get();
        expect(units.docs.map((doc) => doc.get('staleReclaims') as unknown)).toEqual([0]);
      });
    });

    describe('a submit whose answer is lost', () => {
      test(`${bug} the submit still created its job, and enqueues its first task (no wait for the sweeper)`, async () => {
        const logger = { warn: () => undefined, error: () => undefined };
        answers.arm(1); // the job's creating commit
        const outcome = await submitJob({ store: harness.store, queue: harness.queue, logger } satisfies SubmitDeps, { owner: 'user-1', pipeline: 'two-phase', input: { sections: 1 }, conversationId: null, idempotencyKey: 'lost-answer' });
        expect(answers.lost()).toBe(1);
        expect(outcome).toMatchObject({ kind: 'accepted', created: true });
        const jobId = outcome.kind === 'accepted' ? outcome.job.id : '';
        expect(harness.queue.tasks.map((queued) => queued.task)).toEqual([{ jobId, step: 0 }]);
        expect(kinds(await harness.drain())).toEqual(['handed-off', 'handed-off', 'completed']);
      });
    });

    describe('a commit that starts the next task, whose answer is lost', () => {
      test(`${bug} a hand-off still dispatches the next step (no wait for the sweeper)`, async () => {
        behaviour.first = (context) => {
          answers.arm(1); // the hand-off is the next commit of this step
          return Promise.resolve({ kind: 'done', state: { sections: context.input.sections } });
        };
        const jobId = await harness.submit('two-phase', { sections: 1 });
        expect(kinds(await deliver(nextTask()))).toEqual(['handed-off']);
        expect(answers.lost()).toBe(1);
        const job = await readJob(jobId);
        expect(harness.queue.tasks.map((queued) => queued.id)).toEqual([stepTaskId(jobId, job.step, job.dispatch)]);
        expect(kinds(await harness.drain())).toEqual(['handed-off', 'completed']);
      });

      test(`${bug} a fan-out start still dispatches its units`, async () => {
        const jobId = await harness.submit(`lost-answer-units-${heard}`, { units: 2 });
        answers.arm(2); // the claim, then the fan-out start
        expect(kinds(await deliver(nextTask()))).toEqual(['fanned-out']);
        expect(answers.lost()).toBe(1);
        expect(harness.queue.tasks.map((queued) => queued.task.unit)).toEqual(['u0', 'u1']);
        expect(kinds(await harness.drain())).toEqual(['unit-done', 'unit-done', 'completed']);
        expect((await readJob(jobId)).status).toBe('completed');
      });

      test(`${bug} a join whose unit lease is due for renewal still dispatches the next step (a landed finish is not renewed as a lost race)`, async () => {
        held.turns.run = () => {
          // The finishing commit is the first of the unit since its claim a heartbeat ago: a lost race would renew the lease first.
          harness.clock.advance(harness.options.heartbeatSeconds * 1000);
          answers.arm(1);
          return Promise.resolve(unitFinished);
        };
        const jobId = await harness.submit(`lost-answer-units-${heard}`, { units: 1 });
        expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);
        expect(kinds(await deliver(nextTask()))).toEqual(['unit-done']);
        expect(answers.lost()).toBe(1);
        const job = await readJob(jobId);
        expect({ status: job.status, fanout: job.fanout, tasks: harness.queue.tasks.map((queued) => queued.id) }).toEqual({
          status: 'queued',
          fanout: null,
          tasks: [stepTaskId(jobId, job.step, job.dispatch)],
        });
      });

    test(`${bug} a join still dispatches the next step`, async () => {
        held.turns.run = () => {
          answers.arm(1); // the unit's finishing commit, which joins, is its next commit
          return Promise.resolve(unitFinished);
        };
        const jobId = await harness.submit(`lost-answer-units-${heard}`, { units: 1 });
        expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);
        expect(kinds(await deliver(nextTask()))).toEqual(['unit-done']);
        expect(answers.lost()).toBe(1);
        const job = await readJob(jobId);
        expect({ status: job.status, fanout: job.fanout, tasks: harness.queue.tasks.map((queued) => queued.id) }).toEqual({
          status: 'queued',
          fanout: null,
          tasks: [stepTaskId(jobId, job.step, job.dispatch)],
        });
        expect(kinds(await harness.drain())).toEqual(['completed']);
      });
    });
  });
}

lostAnswerCases('transient', 'bug 27:');
lostAnswerCases('sdk-retry', 'bug 45:');
