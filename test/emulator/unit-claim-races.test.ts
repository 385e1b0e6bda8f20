/**
 * Unit claims and take-overs are conditioned commits (JobStore.commitUnitChange): a plain read of
 * the job, the unit and its claim slot, then one batch conditioned on them. Each test builds one
 * interleaving around that read and that commit: duplicate deliveries, cancels, take-overs racing
 * finishes, missing slots, quarantine; exactly one holder runs the unit, and no stale write lands.
 */
import { FieldValue, type DocumentReference, type DocumentSnapshot, type ReadOptions, type Timestamp } from 'firebase-admin/firestore';
import { OwnershipLostError } from '../../functions/src/core/errors';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { decodeJob } from '../../functions/src/store/codec';
import { JobStore } from '../../functions/src/store/job-store';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite, gate } from '../support/engine';
import { heldUnitsPipeline, hold } from '../support/held-units';
import type { RecordedTask } from '../support/task-queue';

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
    const bothRead = gate();
    let queuedReads = 0;
    interceptClaimReads(jobId, async (status) => {
      if (status !== 'queued') return;
      queuedReads += 1;
      if (queuedReads === 2) bothRead.open();
      if (queuedReads <= 2) await bothRead.promise;
    });
    const task = taskOf(tasks, 'u0').task;
    const outcomes = await Promise.all([runStep(harness.deps('worker-a'), task), runStep(harness.deps('worker-b'), task)]);
    expect(queuedReads).toBe(2);
    expect(runs).toEqual(['u0']);
    expect(outcomes.map((o) => o.kind).sort()).toEqual(['not-yet-due', 'unit-done'].sort());
  });

  test.each([
    ['fan-out with unit IDs', false],
    ['legacy fan-out without unit IDs', true],
  ])('a claim read before a cancel (%s) commits nothing after it', async (_kind, legacy) => {
    const { jobId, tasks } = await fannedOut(2, legacy);
    const runs = recordRuns();
    const canceller = new JobStore(db(), harness.clock, harness.options);
    let cancelled = false;
    interceptClaimReads(jobId, async () => {
      if (cancelled) return;
      cancelled = true;
      await cancelJob(canceller, { jobId, owner: 'user-1', reason: 'racing a claim' });
    });
    const outcome = await runStep(harness.deps('worker-a'), taskOf(tasks, 'u0').task);
    expect(cancelled).toBe(true);
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
        try {
          await context.recordSection('late', { value: 9 });
          aWrites.push('section committed');
        } catch (error) {
          aWrites.push(error instanceof OwnershipLostError ? 'OwnershipLostError' : error);
        }
        return { kind: 'done', state: { value: 1 } };
      }
      holdB.arrive();
      await holdB.released;
      return { kind: 'done', state: { value: 2 } };
    };
    const task = taskOf(tasks, 'u0').task;
    const a = runStep(harness.deps('worker-a'), task);
    await holdA.entered;
    harness.clock.advance((harness.options.staleHeartbeatSeconds + 1) * 1000);
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
        try {
          await context.recordSection('late', { value: 9 });
          aWrites.push('section committed');
        } catch (error) {
          aWrites.push(error instanceof OwnershipLostError ? 'OwnershipLostError' : error);
        }
        return { kind: 'done', state: { value: 1 } };
      };
      await db().doc(`${JOBS}/${jobId}/units/experts~u0`).update({ staleReclaims: harness.options.maxStaleReclaims });
      const task = taskOf(tasks, 'u0').task;
      const a = runStep(harness.deps('worker-a'), task);
      await holdA.entered;
      harness.clock.advance((harness.options.staleHeartbeatSeconds + 1) * 1000);
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
    harness.clock.advance((harness.options.staleHeartbeatSeconds + 1) * 1000);
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
    harness.clock.advance((harness.options.staleHeartbeatSeconds + 1) * 1000);
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
    const bothRead = gate();
    let queuedReads = 0;
    interceptClaimReads(jobId, async (status) => {
      if (status !== 'queued') return;
      queuedReads += 1;
      if (queuedReads === 2) bothRead.open();
      if (queuedReads <= 2) await bothRead.promise;
    });
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
    const canceller = new JobStore(db(), harness.clock, harness.options);
    let cancelled = false;
    interceptClaimReads(jobId, async () => {
      if (cancelled) return;
      cancelled = true;
      await cancelJob(canceller, { jobId, owner: 'user-1', reason: 'racing a claim' });
    });
    const outcome = await runStep(harness.deps('worker-a'), taskOf(tasks, 'u0').task);
    expect((await readJob(jobId)).status).toBe('cancelled');
    expect(runs).toEqual([]);
    expect(outcome.kind).toBe('not-claimable');
  });
});
