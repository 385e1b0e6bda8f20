/**
 * The first section recorded after a lost worker resets the lost-worker (poison) count on the job
 * or unit record in the same commit: a commit conditioned on the record (asOwner for a job,
 * commitAsUnitOwner for a unit, which also rewrites the unit's claim slot), not a transaction that
 * locks the record while the section is looked for. Then what meets it: a section that appears
 * between the look and the commit, stale writers, sections already there, and the unit's
 * ClaimSession after the slot rewrite.
 */
import { pipelineRegistry, type PhaseOutcome, type StepContext } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import { sweep } from '../../functions/src/engine/sweeper';
import { JobStore } from '../../functions/src/store/job-store';
import { JOBS, sectionKey, sectionPath, unitPath } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { hold, unitsPipeline } from '../support/held-units';
import { afterFirstGet, whileInterposed } from '../support/interpose';
import { behaviour, recordSections, testPipeline, type TestInput } from '../support/test-pipeline';

type UnitTurn = (context: StepContext<{ units: number }>) => Promise<void>;
/** A unit's first run records its one section, `only`; a test may set another turn. */
const recordOnlySection: UnitTurn = async (context) => {
  if (context.sections().length === 0) await context.recordSection('only', { value: 5 });
};
let unitTurn: UnitTurn = recordOnlySection;

/** Each unit runs `unitTurn` (records what it records), then finishes with the number of its sections. */
const turnUnits = unitsPipeline(
  'turn-units',
  async (context) => {
    await unitTurn(context);
    return { kind: 'done', state: { value: context.sections().length } };
  },
  { phase: 'gather', description: 'Test pipeline: fan-out units whose work the test sets' },
);

const harness = engineSuite('poison', pipelineRegistry(testPipeline, turnUnits), {
  beforeEach: () => {
    unitTurn = recordOnlySection;
  },
});

const db = () => harness.firestore.db;
const RESET_MESSAGE = /lost-worker count starts again/;
const resetEvents = async (jobId: string): Promise<number> =>
  (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.filter((doc) => doc.get('kind') === 'progress' && RESET_MESSAGE.test(String(doc.get('message')))).length;
/** A worker in another process: a JobStore of its own (its own remembered owner views). */
const otherProcess = () => new JobStore(db(), harness.clock, harness.options);

async function expireAndSweep(): Promise<void> {
  harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
  await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
}

/** Holds the first two claims (worker A, soon stale, then B, its successor) where they enter, each until released; `enter` answers which claim it is. */
function firstTwoClaimsHeld() {
  const a = hold();
  const b = hold();
  let claims = 0;
  return {
    a,
    b,
    async enter(): Promise<number> {
      claims += 1;
      const claim = claims;
      const at = [a, b][claim - 1];
      if (at) {
        at.arrive();
        await at.released;
      }
      return claim;
    },
  };
}

test("a job's first section after lost workers resets their count in the job's conditioned commit: no transaction", async () => {
  const jobId = await harness.submit('two-phase', { sections: 2 });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  // Two workers were lost on this job without progress (what a stale reclaim counts).
  await db().doc(`${JOBS}/${jobId}`).update({ staleReclaims: 2 });
  const transactions = jest.spyOn(db(), 'runTransaction');
  let kinds;
  try {
    kinds = (await harness.drain(1)).map((outcome) => outcome.kind);
    expect(transactions).not.toHaveBeenCalled();
  } finally {
    transactions.mockRestore();
  }
  expect(kinds).toEqual(['handed-off']);
  expect(await resetEvents(jobId)).toBe(1);
  expect((await db().collection(`${JOBS}/${jobId}/sections`).get()).size).toBe(2);
});

test("a unit's first section after lost workers resets the unit's count in its conditioned commit: no transaction", async () => {
  const jobId = await harness.submit('turn-units', { units: 1 });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  const unitDoc = db().doc(unitPath(jobId, 'gather', 'u0'));
  await unitDoc.update({ staleReclaims: 2 });
  const [unitTask] = harness.queue.drain();
  const transactions = jest.spyOn(db(), 'runTransaction');
  let outcome;
  try {
    outcome = await runStep(harness.deps('unit-worker'), unitTask!.task);
    expect(transactions).not.toHaveBeenCalled();
  } finally {
    transactions.mockRestore();
  }
  expect(outcome.kind).toBe('unit-done');
  expect((await unitDoc.get()).get('staleReclaims')).toBe(0);
  expect(await resetEvents(jobId)).toBe(1);
});

test("a unit's section that appears between the look for it and the commit is not written twice: the first write stands and the unit goes on", async () => {
  const jobId = await harness.submit('turn-units', { units: 1 });
  await harness.drain(1);
  await db().doc(unitPath(jobId, 'gather', 'u0')).update({ staleReclaims: 1 });
  const [unitTask] = harness.queue.drain();
  const section = db().doc(sectionPath(jobId, sectionKey('gather', 'u0', 'only')));
  const interposed = afterFirstGet(db(), section.path, async () => {
    await section.create({ id: 'only', phase: 'gather', unit: 'u0', data: { value: 7 }, epoch: 1 });
  });
  const outcome = await whileInterposed(interposed, () => runStep(harness.deps('unit-worker'), unitTask!.task));
  expect(interposed.ran()).toBe(true);
  expect(outcome.kind).toBe('unit-done');
  expect((await section.get()).get('data')).toEqual({ value: 7 });
});

test("a job's section that appears between the look for it and the commit: the commit is decided again and the first write stands", async () => {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  await harness.drain(1);
  await db().doc(`${JOBS}/${jobId}`).update({ staleReclaims: 1 });
  const section = db().doc(sectionPath(jobId, sectionKey('second', null, 's0')));
  const interposed = afterFirstGet(db(), section.path, async () => {
    await section.create({ id: 's0', phase: 'second', unit: null, data: { value: 70 }, epoch: 2 });
  });
  const outcomes = await whileInterposed(interposed, () => harness.drain());
  expect(interposed.ran()).toBe(true);
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'completed']);
  expect((await section.get()).get('data')).toEqual({ value: 70 });
});

test("a stale job worker whose first section would reset the poison count: its section does not land and the count stays; the new owner's first section resets it once", async () => {
  const jobId = await harness.submit('two-phase', { sections: 2 });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['handed-off']);
  await db().doc(`${JOBS}/${jobId}`).update({ staleReclaims: 1 });
  const claims = firstTwoClaimsHeld();
  behaviour.second = async (context: StepContext<TestInput>): Promise<PhaseOutcome<{ total: number }>> => {
    await claims.enter();
    return recordSections(context);
  };
  const [taskOfA] = harness.queue.drain();
  const a = runStep(harness.deps('worker-a', { store: otherProcess() }), taskOfA!.task);
  await claims.a.entered;
  await expireAndSweep();
  const [taskOfB] = harness.queue.drain();
  expect(taskOfB).toBeDefined();
  const staleAfterReclaim = (await db().doc(`${JOBS}/${jobId}`).get()).get('staleReclaims') as number;
  expect(staleAfterReclaim).toBe(2);
  const b = runStep(harness.deps('worker-b'), taskOfB!.task);
  await claims.b.entered;
  claims.a.release();
  expect((await a).kind).toBe('ownership-lost');
  expect((await db().collection(`${JOBS}/${jobId}/sections`).get()).size).toBe(0);
  expect((await db().doc(`${JOBS}/${jobId}`).get()).get('staleReclaims')).toBe(2);
  expect(await resetEvents(jobId)).toBe(0);
  claims.b.release();
  expect((await b).kind).toBe('handed-off');
  expect((await harness.drain()).map((outcome) => outcome.kind)).toEqual(['completed']);
  expect(await resetEvents(jobId)).toBe(1);
  expect((await db().doc(`${JOBS}/${jobId}`).get()).get('staleReclaims')).toBe(0);
  const epochs = (await db().collection(`${JOBS}/${jobId}/sections`).get()).docs.map((doc) => doc.get('epoch') as number);
  expect(new Set(epochs).size).toBe(1);
});

test('a job section already recorded (by a lost worker) is not progress: re-recording it resets nothing; the first new section resets once', async () => {
  const jobId = await harness.submit('two-phase', { sections: 2 });
  await harness.drain(1);
  // A lost worker recorded s0 before it died; the job then counted it lost.
  await db().doc(sectionPath(jobId, sectionKey('second', null, 's0'))).create({ id: 's0', phase: 'second', unit: null, data: { value: 0 }, epoch: 1 });
  await db().doc(`${JOBS}/${jobId}`).update({ staleReclaims: 3 });
  const counts: number[] = [];
  behaviour.second = async (context) => {
    // Records s0 again regardless (a phase that does not look at context.sections()).
    await context.recordSection('s0', { value: 999 });
    counts.push((await db().doc(`${JOBS}/${jobId}`).get()).get('staleReclaims') as number);
    await context.recordSection('s1', { value: 10 });
    counts.push((await db().doc(`${JOBS}/${jobId}`).get()).get('staleReclaims') as number);
    return { kind: 'done', state: { total: 10 } };
  };
  const outcomes = await harness.drain();
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'completed']);
  expect(counts).toEqual([3, 0]);
  expect(await resetEvents(jobId)).toBe(1);
  expect((await db().doc(sectionPath(jobId, sectionKey('second', null, 's0'))).get()).get('data')).toEqual({ value: 0 });
});

test("a unit's first section after lost workers rewrites its claim slot; its next transcript saves and sections still commit through its ClaimSession", async () => {
  const jobId = await harness.submit('turn-units', { units: 1 });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  const unitDoc = db().doc(unitPath(jobId, 'gather', 'u0'));
  await unitDoc.update({ staleReclaims: 2 });
  const errors: unknown[] = [];
  unitTurn = async (context) => {
    try {
      await context.saveTranscript('a', { turns: ['before'] });
      await context.recordSection('a', { value: 1 });
      // The slot was rewritten by the resetting commit: the session's remembered update time is stale now.
      await context.saveTranscript('b', { turns: ['first'] });
      await context.saveTranscript('b', { turns: ['first', 'second'] });
      await context.recordSection('b', { value: 2 });
      await context.saveTranscript('c', { turns: ['x'] });
    } catch (error) {
      errors.push(error);
      throw error;
    }
  };
  const [unitTask] = harness.queue.drain();
  const outcome = await runStep(harness.deps('unit-worker'), unitTask!.task);
  expect(errors).toEqual([]);
  expect(outcome.kind).toBe('unit-done');
  expect((await unitDoc.get()).get('staleReclaims')).toBe(0);
  expect(await resetEvents(jobId)).toBe(1);
  const sections = (await db().collection(`${JOBS}/${jobId}/sections`).get()).docs.map((doc) => doc.get('id') as string).sort();
  expect(sections).toEqual(['a', 'b']);
  const transcripts = (await db().collection(`${JOBS}/${jobId}/transcripts`).get()).docs.map((doc) => doc.get('id') as string);
  expect(transcripts).toContain('c');
});

test("a stale unit worker whose first section would reset the unit's poison count: nothing lands, the unit's count stays, the new holder resets it", async () => {
  const jobId = await harness.submit('turn-units', { units: 1 });
  await harness.drain(1);
  const unitDoc = db().doc(unitPath(jobId, 'gather', 'u0'));
  await unitDoc.update({ staleReclaims: 1 });
  const claims = firstTwoClaimsHeld();
  unitTurn = async (context) => {
    const claim = await claims.enter();
    if (context.sections().length === 0) await context.recordSection('only', { value: claim });
  };
  const [taskOfA] = harness.queue.drain();
  const a = runStep(harness.deps('worker-a', { store: otherProcess() }), taskOfA!.task);
  await claims.a.entered;
  await expireAndSweep();
  const tasks = harness.queue.drain();
  expect(tasks).toHaveLength(1);
  const unitStaleAfterReclaim = (await unitDoc.get()).get('staleReclaims') as number;
  expect(unitStaleAfterReclaim).toBe(2);
  const b = runStep(harness.deps('worker-b'), tasks[0]!.task);
  await claims.b.entered;
  claims.a.release();
  expect((await a).kind).toBe('ownership-lost');
  expect((await db().collection(`${JOBS}/${jobId}/sections`).get()).size).toBe(0);
  expect((await unitDoc.get()).get('staleReclaims')).toBe(2);
  expect(await resetEvents(jobId)).toBe(0);
  claims.b.release();
  expect((await b).kind).toBe('unit-done');
  expect((await db().doc(sectionPath(jobId, sectionKey('gather', 'u0', 'only'))).get()).get('data')).toEqual({ value: 2 });
  expect((await unitDoc.get()).get('staleReclaims')).toBe(0);
  expect(await resetEvents(jobId)).toBe(1);
});
