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
import type { Query, QuerySnapshot, WriteBatch, WriteResult } from 'firebase-admin/firestore';
import { z } from 'zod';
import type { JobRecord } from '../../functions/src/core/job';
import { definePhase, definePipeline, pipelineRegistry, type PhaseOutcome, type PipelineRegistry, type StepContext } from '../../functions/src/core/pipeline';
import { checkpointDocumentFor } from '../../functions/src/engine/checkpoints';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { decodeJob } from '../../functions/src/store/codec';
import { checkpointPath, JOBS, jobPath } from '../../functions/src/store/paths';
import { engineHarness, gate, type EngineHarness } from '../support/engine';
import { behaviour, firstPhase, resetBehaviour, testPipelines } from '../support/test-pipeline';

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
  harness.clock.advance((harness.options.staleHeartbeatSeconds + 1) * 1000);
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
