/**
 * A fan-out that ends while a unit is still running (a sibling quarantines the job, the owner
 * cancels it): the commit that ends it revokes every unit's claim slot, so the running unit's
 * next section or transcript is refused and nothing of it lands. Found by a hostile review of the
 * owner-write path; each test failed before its fix.
 */
import { FieldValue, type DocumentReference, type DocumentSnapshot, type ReadOptions } from 'firebase-admin/firestore';
import { OwnershipLostError, RetryableError, TerminalError } from '../../functions/src/core/errors';
import { pipelineRegistry, type StepContext, type UnitOutcome } from '../../functions/src/core/pipeline';
import { releaseQuarantined } from '../../functions/src/engine/operator';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep } from '../../functions/src/engine/sweeper';
import { decodeJob } from '../../functions/src/store/codec';
import { JobStore } from '../../functions/src/store/job-store';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite, gate } from '../support/engine';
import { heldUnitsPipeline, type Hold, hold, holdThen, unitFinished, type UnitInput, type UnitResult, unitsPipeline } from '../support/held-units';
import { afterFirstGetAll, whileInterposed } from '../support/interpose';
import type { RecordedTask } from '../support/task-queue';
import { ManualTimers } from '../support/timers';
import { takeoverAgeMs } from '../../functions/src/core/options';

const { pipeline: reviewUnits, turns: unitTurns } = heldUnitsPipeline('review-units');

const harness = engineSuite('owner-path-review', pipelineRegistry(reviewUnits), {
  beforeEach: () => {
    unitTurns.reset();
  },
});

const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const kinds = (outcomes: readonly StepOutcome[]) => outcomes.map((outcome) => outcome.kind);

function unitTask(tasks: readonly RecordedTask[], unit: string): RecordedTask {
  const task = tasks.find((candidate) => candidate.task.unit === unit);
  if (!task) throw new Error(`no task for unit ${unit}`);
  return task;
}

/** What a unit worker's owner writes left in the database, by section key prefix. */
async function writesOfUnit(jobId: string, unit: string): Promise<{ sections: string[]; transcripts: string[] }> {
  const prefix = `experts~${unit}~`;
  const sections = (await db().collection(`${JOBS}/${jobId}/sections`).get()).docs.map((doc) => doc.id).filter((id) => id.startsWith(prefix));
  const transcripts = (await db().collection(`${JOBS}/${jobId}/transcripts`).get()).docs.map((doc) => doc.id).filter((id) => id.startsWith(prefix));
  return { sections, transcripts };
}

/** The unit worker's stale writes: a transcript save and a section, each either refused or landed. */
async function staleWrites(context: StepContext<UnitInput>, outcomes: unknown[]): Promise<UnitOutcome<UnitResult>> {
  try {
    await context.saveTranscript('late', { messages: [{ role: 'user', content: 'stale' }] });
    outcomes.push('transcript committed');
  } catch (error) {
    outcomes.push(error);
  }
  try {
    await context.recordSection('late', { value: 14 });
    outcomes.push('section committed');
  } catch (error) {
    outcomes.push(error);
  }
  return { kind: 'done', state: { value: 1 } };
}

type PrivateStore = { revokeUnitsOf: (jobId: string, fanout: unknown) => Promise<void> };

/** A job of one unit, fanned out, its unit's task started by worker-a (which the test's unit turn holds). */
async function oneUnitRunning(): Promise<{ jobId: string; a: Promise<StepOutcome> }> {
  const jobId = await harness.submit('review-units', { units: 1 });
  expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);
  const [task] = harness.queue.drain();
  if (!task) throw new Error('no unit task');
  return { jobId, a: runStep(harness.deps('worker-a'), task.task) };
}

describe('a fan-out that ends while a unit runs', () => {
  test('bug 15: a sibling unit quarantines the job (sweeper reclaim over budget): the running unit is revoked in that commit, its transcript and section are refused', async () => {
    const outcomes: unknown[] = [];
    const holdA = hold();
    const holdC = hold();
    unitTurns.run = async (context, unit) => {
      if (unit === 'u1') {
        holdC.arrive();
        await holdC.released;
        return { kind: 'done', state: { value: 1 } };
      }
      holdA.arrive();
      await holdA.released;
      return staleWrites(context, outcomes);
    };
    const jobId = await harness.submit('review-units', { units: 2 });
    expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);
    const tasks = harness.queue.drain();
    // Fixture: u1 has already lost its budget of workers, so the next expired lease quarantines the job.
    const u1Ref = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs.find((doc) => doc.get('unit') === 'u1')?.ref;
    if (!u1Ref) throw new Error('no unit u1');
    await u1Ref.update({ staleReclaims: harness.options.maxStaleReclaims });

    const c = runStep(harness.deps('worker-c'), unitTask(tasks, 'u1').task);
    await holdC.entered;
    harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
    const a = runStep(harness.deps('worker-a'), unitTask(tasks, 'u0').task);
    await holdA.entered;

    const report = await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
    expect(report.quarantined).toBe(1);
    expect(await readJob(jobId)).toMatchObject({ status: 'quarantined' });
    const slot = await db().doc(`${JOBS}/${jobId}/claims/experts~u0`).get();
    // Revoked by the quarantining commit itself, which also ends the job's fan-out.
    expect({ slotState: slot.get('state') as unknown }).toEqual({ slotState: 'revoked' });

    holdA.release();
    expect((await a).kind).toBe('ownership-lost');
    holdC.release();
    await c;
    expect(outcomes.map((outcome) => (outcome instanceof OwnershipLostError ? 'OwnershipLostError' : outcome))).toEqual(['OwnershipLostError', 'OwnershipLostError']);
    expect(await writesOfUnit(jobId, 'u0')).toEqual({ sections: [], transcripts: [] });
  });

  test('bug 15: a commit that stops the job ends its fan-out in the store even when the record it writes keeps the fan-out: the running unit is revoked in that commit', async () => {
    const outcomes: unknown[] = [];
    const holdA = hold();
    unitTurns.run = (context) => holdThen(holdA, () => staleWrites(context, outcomes));
    const jobId = await harness.submit('review-units', { units: 1 });
    expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);
    const a = runStep(harness.deps('worker-a'), unitTask(harness.queue.drain(), 'u0').task);
    await holdA.entered;

    // Every move in the table clears the fan-out when it stops a job; the store does not rely on it.
    const nowMs = harness.clock.now();
    await harness.store.transact(jobId, () => null, ({ job }) => {
      expect(job.fanout).not.toBeNull();
      return Promise.resolve({ next: { ...job, status: 'failed' as const, lease: null, finishedAtMs: nowMs }, value: undefined });
    });
    const slot = await db().doc(`${JOBS}/${jobId}/claims/experts~u0`).get();
    expect({ slotState: slot.get('state') as unknown }).toEqual({ slotState: 'revoked' });

    holdA.release();
    expect((await a).kind).toBe('ownership-lost');
    // Its transcript and its section, both refused.
    expect(outcomes.map((outcome) => (outcome instanceof OwnershipLostError ? 'OwnershipLostError' : outcome))).toEqual(['OwnershipLostError', 'OwnershipLostError']);
    expect(await writesOfUnit(jobId, 'u0')).toEqual({ sections: [], transcripts: [] });
  });

  test('bug 15: an owner cancels the job during a fan-out: the cancel commit itself revokes the running unit (nothing after it is needed), its transcript and section are refused', async () => {
    const outcomes: unknown[] = [];
    const holdA = hold();
    unitTurns.run = (context) => holdThen(holdA, () => staleWrites(context, outcomes));
    const { jobId, a } = await oneUnitRunning();
    await holdA.entered;

    // The HTTP function's store, with the after-commit revocation (the fallback for fan-outs recorded without unit IDs) switched off.
    const httpStore = new JobStore(db(), harness.clock, harness.options);
    let revokedAfterCommit = 0;
    (httpStore as unknown as PrivateStore).revokeUnitsOf = () => {
      revokedAfterCommit += 1;
      return Promise.resolve();
    };
    await cancelJob(httpStore, { jobId, owner: 'user-1', reason: 'no longer needed' });
    expect(await readJob(jobId)).toMatchObject({ status: 'cancelled', fanout: null });
    expect(revokedAfterCommit).toBe(0);

    holdA.release();
    expect((await a).kind).toBe('ownership-lost');
    expect(outcomes.map((outcome) => (outcome instanceof OwnershipLostError ? 'OwnershipLostError' : outcome))).toEqual(['OwnershipLostError', 'OwnershipLostError']);
    expect(await writesOfUnit(jobId, 'u0')).toEqual({ sections: [], transcripts: [] });
  });

  test('bug 15: a fan-out recorded without unit IDs is revoked after the commit; a transient error there neither repeats nor undoes the committed cancel', async () => {
    const holdA = hold();
    unitTurns.run = () => holdThen(holdA, () => Promise.resolve(unitFinished));
    const { jobId, a } = await oneUnitRunning();
    await holdA.entered;

    // As recorded before fan-outs listed their units.
    await db().doc(`${JOBS}/${jobId}`).update({ 'fanout.unitIds': FieldValue.delete() });
    const httpStore = new JobStore(db(), harness.clock, harness.options);
    const original = (httpStore as unknown as PrivateStore).revokeUnitsOf.bind(httpStore);
    let failures = 0;
    (httpStore as unknown as PrivateStore).revokeUnitsOf = async (id, fanout) => {
      if (failures === 0) {
        failures += 1;
        // What the revocation's query or transaction meets on a bad second: UNAVAILABLE.
        throw Object.assign(new Error('14 UNAVAILABLE: injected'), { code: 14 });
      }
      return original(id, fanout);
    };
    const cancelled = await cancelJob(httpStore, { jobId, owner: 'user-1', reason: 'no longer needed' }).then(
      (result) => ({ ok: true as const, status: result.job.status }),
      (error: unknown) => ({ ok: false as const, error: error instanceof Error ? error.message : String(error) }),
    );
    expect(await readJob(jobId)).toMatchObject({ status: 'cancelled' });
    holdA.release();
    await a;
    expect(cancelled).toEqual({ ok: true, status: 'cancelled' });
    expect(failures).toBe(1);
  });

  test('a cancel during a fan-out, then the unit writes: refused, nothing lands', async () => {
    const outcomes: unknown[] = [];
    const holdA = hold();
    unitTurns.run = (context) => holdThen(holdA, () => staleWrites(context, outcomes));
    const { jobId, a } = await oneUnitRunning();
    await holdA.entered;
    await cancelJob(new JobStore(db(), harness.clock, harness.options), { jobId, owner: 'user-1', reason: 'no longer needed' });
    holdA.release();
    expect((await a).kind).toBe('ownership-lost');
    expect(outcomes.map((outcome) => (outcome instanceof OwnershipLostError ? 'OwnershipLostError' : outcome))).toEqual(['OwnershipLostError', 'OwnershipLostError']);
    expect(await writesOfUnit(jobId, 'u0')).toEqual({ sections: [], transcripts: [] });
  });
});

/**
 * The three ways a unit quarantines its job: a redelivered task taking over its silent holder, a
 * stalled step giving the unit back, the sweeper reclaiming its expired lease. Each hands back the
 * held worker's step (wrapped: an async function would wait for it), to be awaited once it is let go.
 */
const unitQuarantines = {
  'the unit claim taking over a silent holder': async (task: RecordedTask, held: Hold) => {
    const silent = runStep(harness.deps('worker-silent'), task.task);
    await held.entered;
    harness.clock.advance(takeoverAgeMs(harness.options) + 1_000);
    expect(await runStep(harness.deps('worker-redelivered'), task.task)).toMatchObject({ kind: 'not-claimable', reason: expect.stringMatching(/^job quarantined/) as unknown });
    return { silent };
  },
  "the give-back of a stalled unit step": async (task: RecordedTask, held: Hold) => {
    const timers = new ManualTimers();
    const stalled = runStep(harness.deps('worker-stalled', { timers }), task.task);
    await held.entered;
    harness.clock.advance((harness.options.progressTimeoutSeconds + 1) * 1000);
    timers.fireAll();
    expect(await stalled).toMatchObject({ kind: 'stalled' });
    return { silent: stalled };
  },
  "the sweeper's reclaim of an expired unit lease": async (task: RecordedTask, held: Hold) => {
    const silent = runStep(harness.deps('worker-silent'), task.task);
    await held.entered;
    harness.clock.advance((harness.options.leaseSeconds + 1) * 1000);
    expect((await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now())).quarantined).toBe(1);
    return { silent };
  },
};

describe('bug 20: no fan-out outlives the claim that started it', () => {
  test.each(Object.keys(unitQuarantines))(
    'bug 20: a unit quarantines the job through %s; after a release, the old fan-out\'s retry task neither claims its unit nor fails the job, which finishes under the release\'s claim',
    async (path) => {
      const quarantineThrough = unitQuarantines[path as keyof typeof unitQuarantines];
      const u1Held = hold();
      let u1Released = false;
      let oldRetryRuns = 0;
      let u0Runs = 0;
      let deliveringOldRetry = false;
      unitTurns.run = async (_context, unit) => {
        if (unit === 'u1' && !u1Released) {
          u1Held.arrive();
          await u1Held.released;
        }
        if (unit === 'u0') {
          u0Runs += 1;
          if (deliveringOldRetry) {
            oldRetryRuns += 1;
            throw new TerminalError('the old fan-out\'s unit failed for good');
          }
          if (u0Runs === 1) throw new RetryableError('u0 fails once; its retry waits out a backoff');
        }
        return { kind: 'done', state: { value: 1 } };
      };
      const jobId = await harness.submit('review-units', { units: 2 });
      expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);
      const tasks = harness.queue.drain();
      expect((await runStep(harness.deps('worker-u0'), unitTask(tasks, 'u0').task)).kind).toBe('requeued');
      const [oldRetry] = harness.queue.drain();
      if (oldRetry?.task.unit !== 'u0') throw new Error('no retry task for u0');

      // u1 has lost its budget of workers already: the next loss quarantines the job.
      await db().doc(`${JOBS}/${jobId}/units/experts~u1`).update({ staleReclaims: harness.options.maxStaleReclaims });
      const { silent } = await quarantineThrough(unitTask(tasks, 'u1'), u1Held);
      const quarantined = await readJob(jobId);
      expect(quarantined.status).toBe('quarantined');
      u1Released = true;
      u1Held.release();
      await silent;

      await releaseQuarantined(harness.store, harness.queue, jobId, harness.clock.now(), () => undefined, 'ops-ana');
      const released = await readJob(jobId);
      expect(released.status).toBe('queued');
      // The old retry task comes back (its backoff over) while the release's claim holds the job, before that claim starts its own fan-out.
      harness.clock.advance(oldRetry.delaySeconds * 1000);
      const [releaseTask] = harness.queue.drain();
      if (!releaseTask) throw new Error('no task for the released job');
      let oldRetryOutcome: StepOutcome | null = null;
      const interposed = afterFirstGetAll(db(), (paths) => paths.length > 0 && paths.every((path) => path.includes('/units/')), async () => {
        expect(await readJob(jobId)).toMatchObject({ status: 'running', epoch: released.epoch + 1 });
        deliveringOldRetry = true;
        oldRetryOutcome = await runStep(harness.deps('worker-old-retry'), oldRetry.task);
        deliveringOldRetry = false;
      });
      const fannedOut: StepOutcome = await whileInterposed(interposed, () => runStep(harness.deps('worker-released'), releaseTask.task));
      expect(interposed.ran()).toBe(true);
      await harness.drain();

      const job = await readJob(jobId);
      const timeline = (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.map((doc) => doc.get('kind') as string);
      expect({
        fanOutLeftByTheQuarantine: quarantined.fanout,
        fanOutLeftByTheRelease: released.fanout,
        fannedOut: fannedOut.kind,
        oldRetry: (oldRetryOutcome as StepOutcome | null)?.kind,
        oldRetryRuns,
        status: job.status,
        failedEvents: timeline.filter((kind) => kind === 'failed').length,
      }).toEqual({
        fanOutLeftByTheQuarantine: null,
        fanOutLeftByTheRelease: null,
        fannedOut: 'fanned-out',
        oldRetry: 'not-claimable',
        oldRetryRuns: 0,
        status: 'completed',
        failedEvents: 0,
      });
    },
  );
});

/**
 * A fan-out recorded without its unit IDs (from before fan-outs listed them) has its units' claim
 * slots revoked only after the commit that ends it. A unit change that does not write the job (a
 * yield, a requeue) is then conditioned on the job itself: a cancel that lands between the unit's
 * read and its commit fails the commit, and the unit of the cancelled job is never queued again.
 */
describe('a fan-out recorded without its unit IDs (legacy)', () => {
  const steppedPipeline = unitsPipeline(
    'legacy-stepped',
    async (context) => {
      const done = context.sections().length;
      if (done === 3) return { kind: 'done', state: { value: 3 } };
      await context.recordSection(`n${done}`, { value: done + 1 });
      return { kind: 'yield' };
    },
    { phase: 'count', maxUnits: 5, description: 'Test pipeline: fan-out units that yield after each section' },
  );

  type PrivateStore = { revokeUnitsOf: (jobId: string, fanout: unknown) => Promise<void> };

  const harness = engineSuite('legacy-fanout-units', pipelineRegistry(steppedPipeline));

  const db = () => harness.firestore.db;

  /**
   * Runs the unit's first step (one section, then a yield) while the owner cancels the job from another
   * process right after the yield's read. `holdRevocation`: the canceller's after-the-commit revocation
   * waits until the unit's step is over (a slow or crashed canceller); otherwise it runs at once,
   * racing the yield's commit as it would in production.
   */
  async function yieldRacingCancel(holdRevocation: boolean) {
    const jobId = await harness.submit('legacy-stepped', { units: 1 });
    expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['fanned-out']);
    const [unitTask] = harness.queue.drain();
    if (!unitTask) throw new Error('no unit task');
    // As recorded before fan-outs listed their units (the same setup as ended-fanout.test.ts and unit-heartbeat.test.ts).
    await db().doc(`${JOBS}/${jobId}`).update({ 'fanout.unitIds': FieldValue.delete() });

    const canceller = new JobStore(db(), harness.clock, harness.options);
    const original = (canceller as unknown as PrivateStore).revokeUnitsOf.bind(canceller);
    const revocationReached = gate();
    const revocationMayGo = gate();
    (canceller as unknown as PrivateStore).revokeUnitsOf = async (id, fanout) => {
      revocationReached.open();
      if (holdRevocation) await revocationMayGo.promise;
      return original(id, fanout);
    };

    const getAll = db().getAll.bind(db());
    let cancelling: Promise<unknown> | null = null;
    const reads = jest.spyOn(db(), 'getAll').mockImplementation(async (...refs: (DocumentReference | ReadOptions)[]): Promise<DocumentSnapshot[]> => {
      const snapshots = await getAll(...refs);
      const paths = refs.map((ref) => ('path' in ref ? ref.path : ''));
      // The unit's commit after its work (the yield): job, unit and slot read while the unit is held.
      const unitCommitRead =
        paths.length === 3 && paths[0] === `${JOBS}/${jobId}` && paths[1]?.includes('/units/') === true && paths[2]?.includes('/claims/') === true && snapshots[1]?.get('status') === 'running';
      if (cancelling === null && unitCommitRead) {
        cancelling = cancelJob(canceller, { jobId, owner: 'user-1', reason: 'cancelled while its unit commits' });
        // The cancel has committed (its revocation has started): the yield's read is older than it.
        await revocationReached.promise;
      }
      return snapshots;
    });
    let outcome;
    try {
      outcome = await runStep(harness.deps('unit-worker'), unitTask.task);
    } finally {
      reads.mockRestore();
      revocationMayGo.open();
    }
    // Assigned inside the read's mock, which the compiler does not follow.
    const cancelled = cancelling as Promise<unknown> | null;
    expect(cancelled).not.toBeNull();
    await cancelled;

    const job = await db().doc(`${JOBS}/${jobId}`).get();
    const [unit] = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs;
    return {
      outcome: outcome.kind,
      jobStatus: job.get('status') as unknown,
      unitStatus: unit?.get('status') as unknown,
      unitStep: unit?.get('step') as unknown,
      tasksSent: harness.queue.tasks.map((task) => task.id),
    };
  }

  test('legacy fan-out (no unit IDs), the canceller slow after its commit: a yield read before the cancel lands nothing; the unit is not queued again', async () => {
    const seen = await yieldRacingCancel(true);
    expect(seen.jobStatus).toBe('cancelled');
    // The promise: a unit of an ended fan-out is never queued again; the stale holder's write does not land.
    expect(seen).toMatchObject({ outcome: 'ownership-lost', unitStatus: 'running', tasksSent: [] });
  });

  test('legacy fan-out (no unit IDs), no delay anywhere: the yield read before the cancel lands nothing', async () => {
    const seen = await yieldRacingCancel(false);
    expect(seen.jobStatus).toBe('cancelled');
    expect(seen).toMatchObject({ outcome: 'ownership-lost', unitStatus: 'running', tasksSent: [] });
  });
});
