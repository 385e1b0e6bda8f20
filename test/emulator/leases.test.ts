/**
 * The default lease is 20 s (heartbeat 5 s, stale takeover 10 s, progress
 * timeout 150 s), and "a live holder never loses its lease to the sweeper". On the injected clock:
 *
 *   - held: a job phase (and a fan-out unit) that waits on one long call for 145 s, heartbeating
 *     every 5 s, is never reclaimed by the sweeper, and finishes;
 *   - a fan-out unit's finishing commit runs after its flusher stopped (no heartbeat), and retries
 *     against its siblings' job writes up to 8 + 2 × units times: a live unit that keeps losing
 *     that race for longer than the lease is reclaimed by the sweeper, and its finished work is
 *     thrown away.
 */
import { FieldValue, type DocumentReference, type DocumentSnapshot, type ReadOptions, type Firestore, type WriteBatch } from 'firebase-admin/firestore';
import { DEFAULT_ENGINE_OPTIONS, type EngineOptions } from '../../functions/src/core/options';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep, type SweepReport } from '../../functions/src/engine/sweeper';
import { decodeJob, decodeUnit, type UnitRecord } from '../../functions/src/store/codec';
import { jobPath, JOBS } from '../../functions/src/store/paths';
import { engineSuite, gate, engineHarness, type EngineHarness, waitUntil } from '../support/engine';
import { heldUnitsPipeline, hold, holdThen, unitFinished, type Hold } from '../support/held-units';
import { behaviour, testPipeline } from '../support/test-pipeline';
import { ManualTimers } from '../support/timers';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { JobStore } from '../../functions/src/store/job-store';
import type { RecordedTask } from '../support/task-queue';
import { takeoverAgeMs } from '../../functions/src/core/options';

// A fan-out big enough for its finishing commits to race on the job document for longer than a lease.
const { pipeline: manyUnits, turns: unitTurn } = heldUnitsPipeline('many-units', 100);

// The defaults under review (the harness only shortens backoff).
const harness = engineSuite('lease-renewal', pipelineRegistry(testPipeline, manyUnits), {
  beforeEach: () => {
    unitTurn.reset();
  },
  afterEach: () => jest.restoreAllMocks(),
});

const db = () => harness.firestore.db;
const readJob = (jobId: string) => harness.readJob(jobId);
const sweepNow = (): Promise<SweepReport> => sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());


test('the options under review', () => {
  expect(harness.options).toMatchObject({ leaseSeconds: 20, heartbeatSeconds: 5, staleHeartbeatSeconds: 10, progressTimeoutSeconds: 150 });
  expect(DEFAULT_ENGINE_OPTIONS.leaseSeconds).toBe(20);
});

test('held: a job phase waiting 145 s on one call (no progress), heartbeating every 5 s, is never reclaimed by the sweeper and finishes', async () => {
  const timers = new ManualTimers();
  const callReturns = gate();
  const entered = gate();
  behaviour.first = async (context) => {
    entered.open();
    await callReturns.promise;
    context.reportProgress({ calls: 1 });
    return { kind: 'done', state: { sections: 1 } };
  };
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  const worker = runStep(harness.deps('live', { timers }), task!.task);
  await entered.promise;
  for (let second = 5; second <= 145; second += 5) {
    harness.clock.advance(5_000);
    timers.fireAll();
    const now = harness.clock.now();
    await waitUntil(async () => (await readJob(jobId)).lease?.renewedAtMs === now);
    const report = await sweepNow();
    expect(report.reclaimed).toBe(0);
  }
  callReturns.open();
  expect(await worker).toMatchObject({ kind: 'handed-off', phase: 'first' });
  expect((await readJob(jobId)).staleReclaims).toBe(0);
});

test('held: a fan-out unit waiting 145 s on one call, heartbeating every 5 s, is never reclaimed by the sweeper and finishes', async () => {
  const timers = new ManualTimers();
  const callReturns = gate();
  const entered = gate();
  unitTurn.run = async () => {
    entered.open();
    await callReturns.promise;
    return { kind: 'done', state: { value: 1 } };
  };
  const jobId = await harness.submit('many-units', { units: 1 });
  expect((await harness.drain(1))[0]?.kind).toBe('fanned-out');
  const [task] = harness.queue.drain();
  const worker = runStep(harness.deps('live-unit', { timers }), task!.task);
  await entered.promise;
  const unitRef = db().collection(`${JOBS}/${jobId}/units`);
  for (let second = 5; second <= 145; second += 5) {
    harness.clock.advance(5_000);
    timers.fireAll();
    const now = harness.clock.now();
    await waitUntil(async () => {
      const [doc] = (await unitRef.get()).docs;
      return doc !== undefined && decodeUnit(doc.ref.path, doc.data()).lease?.renewedAtMs === now;
    });
    const report = await sweepNow();
    expect(report.unitsReclaimed).toBe(0);
  }
  callReturns.open();
  expect(await worker).toMatchObject({ kind: 'unit-done', joined: true });
});

test('a live unit whose finishing commit keeps losing to its siblings\' job writes for longer than the lease (no heartbeat once its flusher stopped) must not be reclaimed by the sweeper', async () => {
  const units = 60;
  const jobId = await harness.submit('many-units', { units });
  expect((await harness.drain(1))[0]?.kind).toBe('fanned-out');
  const tasks = harness.queue.drain();
  const u0 = tasks.find((recorded) => recorded.task.unit === 'u0');
  expect(u0).toBeDefined();

  // u0's work is done; from here on its step only commits "unit done" (8 + 2 × 60 tries allowed).
  let finishing = false;
  unitTurn.run = () => {
    finishing = true;
    return Promise.resolve({ kind: 'done', state: { value: 1 } });
  };
  // Each of its reads before a commit is overtaken by one sibling's write of the hot job document
  // (Firestore sustains about one write a second on one document): 1 s per try. The sweeper runs as scheduled.
  const getAll = db().getAll.bind(db());
  const jobRef = db().doc(jobPath(jobId));
  let tries = 0;
  const reports: SweepReport[] = [];
  let busy = false;
  jest.spyOn(db(), 'getAll').mockImplementation(async (...refs: (DocumentReference | ReadOptions)[]): Promise<DocumentSnapshot[]> => {
    const snapshots = await getAll(...refs);
    const paths = refs.map((ref) => ('path' in ref ? ref.path : ''));
    if (finishing && !busy && paths[0] === jobRef.path && paths[1]?.includes('/units/') && paths[1].endsWith('~u0') && tries < 100) {
      busy = true;
      tries += 1;
      harness.clock.advance(1_000);
      await jobRef.update({ siblingWrites: FieldValue.increment(1) });
      if (tries % 10 === 0) reports.push(await sweepNow());
      busy = false;
    }
    return snapshots;
  });
  const outcome: StepOutcome = await runStep(harness.deps('u0-worker'), u0!.task);
  jest.restoreAllMocks();

  const reclaimed = reports.reduce((sum, report) => sum + report.unitsReclaimed, 0);
  // The promise: a live holder never loses its lease to the sweeper; its finished work is recorded.
  expect({ reclaimed, outcome: outcome.kind }).toEqual({ reclaimed: 0, outcome: 'unit-done' });
  expect((await readJob(jobId)).fanout?.done).toBe(1);
});

/**
 * A fan-out unit's heartbeat and progress flush on the unit's owner-write path (one batch update
 * conditioned on the claim slot, computed from the holder's own last-written record), with the
 * 5 s heartbeat and 10 s stale threshold. Found by a hostile review: the "bug 16" tests failed
 * before their fixes (a heartbeat that landed twice wrote its note twice; a failed heartbeat let a
 * duplicate task take a live worker's unit; a fan-out recorded without unit IDs left a cancelled
 * unit heartbeating); "held" tests record what was checked and held.
 */
describe('a unit heartbeat: what it flushes and when', () => {
  const { pipeline: flushUnits, turns: unitTurns } = heldUnitsPipeline('flush-units');

  const harnesses = new Map<string, EngineHarness>();
  /** One harness per option set (each its own emulator project). */
  function harnessWith(label: string, overrides: Partial<EngineOptions> = {}): EngineHarness {
    let found = harnesses.get(label);
    if (!found) {
      found = engineHarness(`unit-flush-review-${label}`, pipelineRegistry(flushUnits), overrides);
      harnesses.set(label, found);
    }
    return found;
  }
  let harness: EngineHarness;
  async function use(label: string, overrides: Partial<EngineOptions> = {}): Promise<EngineHarness> {
    harness = harnessWith(label, overrides);
    harness.queue.drain();
    await harness.firestore.reset();
    return harness;
  }
  beforeEach(async () => {
    unitTurns.reset();
    await use('defaults');
  });
  afterAll(async () => {
    for (const found of harnesses.values()) await found.firestore.close();
  });

  const db = () => harness.firestore.db;
  const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  const readUnit = async (jobId: string, unit = 'u0'): Promise<UnitRecord> => {
    const path = `${JOBS}/${jobId}/units/experts~${unit}`;
    const docs = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs.filter((doc) => doc.get('unit') === unit);
    const [doc] = docs;
    if (!doc) throw new Error(`no unit ${unit} (${path})`);
    return decodeUnit(doc.ref.path, doc.data());
  };
  const kinds = (outcomes: readonly StepOutcome[]) => outcomes.map((outcome) => outcome.kind);

  /** What the batch commits of a worker's Firestore do: land, fail before landing, or land once and lose the answer. */
  type Fault = { mode: 'none' | 'fail' | 'lost-answer-once' };
  const unavailable = () => Object.assign(new Error('14 UNAVAILABLE: injected'), { code: 14 });

  /** The worker's Firestore: the real one, with batch commits subject to `fault`. */
  function faultyDb(real: Firestore, fault: Fault): Firestore {
    return new Proxy(real, {
      get(target, prop) {
        if (prop === 'batch') {
          return (): WriteBatch => {
            const batch = target.batch();
            const commit = batch.commit.bind(batch);
            return Object.assign(batch, {
              commit: async () => {
                if (fault.mode === 'fail') throw unavailable();
                const result = await commit();
                if (fault.mode === 'lost-answer-once') {
                  fault.mode = 'none';
                  throw unavailable();
                }
                return result;
              },
            });
          };
        }
        const value: unknown = Reflect.get(target, prop, target);
        return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
      },
    });
  }

  /** A worker's store whose unit-session commits (heartbeats, sections, transcripts) are recorded with how they ended. */
  function workerStore(fault: Fault = { mode: 'none' }) {
    const store = new JobStore(faultyDb(db(), fault), harness.clock, harness.options);
    const results: Promise<unknown>[] = [];
    const base = store.unitSession.bind(store);
    store.unitSession = (claim) => {
      const session = base(claim);
      const commit = session.commit.bind(session);
      session.commit = (label, build) => {
        const run = commit(label, build);
        results.push(run.then(() => `${label} committed`, (error: unknown) => error));
        return run;
      };
      return session;
    };
    return { store, results, fault };
  }

  /** Waits until the worker has started `count` session commits, then for all of them to end. */
  async function settledCommits(results: Promise<unknown>[], count: number): Promise<unknown[]> {
    const until = Date.now() + 10_000;
    while (results.length < count) {
      if (Date.now() > until) throw new Error(`only ${results.length} of ${count} commits started`);
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    return Promise.all(results.slice(0, count));
  }

  /** Fires the worker's timers once its heartbeat is armed again (it is re-armed after the previous flush ends). */
  async function fireWhenArmed(timers: ManualTimers): Promise<void> {
    const until = Date.now() + 10_000;
    while (timers.size === 0) {
      if (Date.now() > until) throw new Error('the heartbeat was never armed again');
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    timers.fireAll();
  }

  const named = (outcomes: readonly unknown[]) => outcomes.map((outcome) => (outcome instanceof Error ? `${outcome.constructor.name}: ${outcome.message}` : outcome));

  async function fanOutOne(units = 1): Promise<{ jobId: string; task: RecordedTask }> {
    const jobId = await harness.submit('flush-units', { units });
    expect(kinds(await harness.drain(1))).toEqual(['fanned-out']);
    const [task] = harness.queue.drain();
    if (!task) throw new Error('no unit task');
    return { jobId, task };
  }

  type PrivateStore = { revokeUnitsOf: (jobId: string, fanout: unknown) => Promise<void> };

  /** One unit fanned out and started by worker-a (a store of its own, timers fired by hand), which the unit turn holds at `at`. */
  async function workerARunsTheUnit(at: Hold) {
    const { jobId, task } = await fanOutOne();
    const a$ = workerStore();
    const timersA = new ManualTimers();
    const a = runStep(harness.deps('worker-a', { store: a$.store, timers: timersA }), task.task);
    await at.entered;
    return { jobId, task, a$, timersA, a };
  }

  describe('unit heartbeats on the owner-write path', () => {
    test('bug 16: a unit of a fan-out recorded without unit IDs heartbeats through the job: after a cancel whose after-commit revocation is lost, its next heartbeat stops it', async () => {
      const warn = jest.spyOn(console, 'warn').mockImplementation(() => undefined);
      const holdA = hold();
      let signal: AbortSignal | null = null;
      unitTurns.run = async (context) => {
        signal = context.signal;
        holdA.arrive();
        await holdA.released;
        return { kind: 'done', state: { value: 1 } };
      };
      const { jobId, task } = await fanOutOne();
      // As recorded before fan-outs listed their units (claimed by this version afterwards).
      await db().doc(`${JOBS}/${jobId}`).update({ 'fanout.unitIds': FieldValue.delete() });
      const timersA = new ManualTimers();
      const a = runStep(harness.deps('worker-a', { timers: timersA }), task.task);
      await holdA.entered;

      // The cancelling process dies (or its revocation fails) right after its commit.
      const httpStore = new JobStore(db(), harness.clock, harness.options);
      (httpStore as unknown as PrivateStore).revokeUnitsOf = () => Promise.reject(unavailable());
      await cancelJob(httpStore, { jobId, owner: 'user-1', reason: 'no longer needed' });
      expect(await readJob(jobId)).toMatchObject({ status: 'cancelled', fanout: null });
      const before = await readUnit(jobId);

      harness.clock.advance(harness.options.heartbeatSeconds * 1000);
      await fireWhenArmed(timersA);
      const until = Date.now() + 10_000;
      while (!(signal as AbortSignal | null)?.aborted && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 5));
      const after = await readUnit(jobId);
      holdA.release();
      const outcome = await a;
      warn.mockRestore();
      expect({
        stepAborted: (signal as AbortSignal | null)?.aborted ?? null,
        outcome: outcome.kind,
        leaseRenewedAfterCancel: (after.lease?.renewedAtMs ?? 0) > (before.lease?.renewedAtMs ?? 0),
      }).toEqual({ stepAborted: true, outcome: 'ownership-lost', leaseRenewedAfterCancel: false });
    });

    test('bug 16: a heartbeat whose commit lands but whose answer is lost is committed again: its timeline note is written once, its cost counted once', async () => {
      const holdA = hold();
      unitTurns.run = async (context) => {
        context.addCost({ modelCalls: 7 });
        context.note('review-note', 'written once by the holder');
        holdA.arrive();
        await holdA.released;
        context.addCost({ modelCalls: 3 });
        return { kind: 'done', state: { value: 1 } };
      };
      const { jobId, a$, timersA, a } = await workerARunsTheUnit(holdA);

      harness.clock.advance(1_000);
      a$.fault.mode = 'lost-answer-once';
      timersA.fireAll(); // the coalesced progress flush and the heartbeat: two flushes, the first loses its answer
      const flushes = await settledCommits(a$.results, 2);
      const unitAfterFlush = await readUnit(jobId);
      holdA.release();
      expect(await a).toMatchObject({ kind: 'unit-done', joined: true });
      expect(kinds(await harness.drain())).toEqual(['completed']);

      const notes = (await db().collection(`${JOBS}/${jobId}/events`).where('kind', '==', 'review-note').get()).docs.map((doc) => doc.get('message') as unknown);
      // What held: the cost is absolute in the blind write, so neither the re-commit nor the final commit counts it twice.
      expect({ flushes: named(flushes), unitCost: unitAfterFlush.cost, jobCost: (await readJob(jobId)).cost }).toEqual({
        flushes: ['heartbeat committed', 'heartbeat committed'],
        unitCost: { modelCalls: 7 },
        jobCost: { modelCalls: 10 },
      });
      expect(notes).toEqual(['written once by the holder']);
    });

    test.each([
      ['with the defaults, 5 s heartbeat and 10 s stale threshold (a failed heartbeat is tried again within a second)', 'defaults', {}],
      ['with the former defaults, 10 s heartbeat and 30 s stale threshold', 'former', { leaseSeconds: 90, heartbeatSeconds: 10, staleHeartbeatSeconds: 30 }],
    ] as const)(
      'bug 16: one failed heartbeat of a live worker, then a duplicate task: the worker keeps its unit; %s',
      async (_, label, overrides) => {
        await use(label, overrides);
        const heartbeatMs = harness.options.heartbeatSeconds * 1000;
        // A duplicate task takes over after the stale age plus the clock-skew allowance.
        const staleMs = takeoverAgeMs(harness.options);
        const holdA = hold();
        let claims = 0;
        unitTurns.run = async () => {
          claims += 1;
          if (claims === 1) {
            holdA.arrive();
            await holdA.released;
          }
          return { kind: 'done', state: { value: 1 } };
        };
        const { jobId, task, a$, timersA, a } = await workerARunsTheUnit(holdA);
        const claimedAt = harness.clock.now();

        // One heartbeat fails (four UNAVAILABLE answers in a row, under a second of backoff); the flusher keeps the payload for the next one.
        harness.clock.advance(heartbeatMs);
        const failAt = harness.clock.now();
        a$.fault.mode = 'fail';
        const startedMs = Date.now();
        timersA.fireAll();
        const [failed] = await settledCommits(a$.results, 1);
        const failedFlushMs = Date.now() - startedMs;
        a$.fault.mode = 'none';
        expect(failed).toBeInstanceOf(Error);
        // The heartbeat is re-armed when the failed flush ends, with the delay the flusher chose, measured from then on a real clock.
        const until = Date.now() + 10_000;
        while (timersA.size === 0 && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 5));
        const [rearmMs = heartbeatMs] = timersA.pendingDelays;
        // Tried again within a second, not a whole interval later: silent that long, a live holder would reach its own stop age (the stale age).
        expect(rearmMs).toBeLessThanOrEqual(1_000);
        const nextBeatAt = failAt + failedFlushMs + rearmMs;

        // A duplicate delivery of the same task (Cloud Tasks is at-least-once) arrives a second later: told to come back when the holder would be silent past the threshold.
        harness.clock.advance(1_000);
        const early = await runStep(harness.deps('worker-b'), task.task);
        expect(early).toEqual({ kind: 'not-yet-due', retryAfterMs: staleMs - (harness.clock.now() - claimedAt) });
        if (early.kind !== 'not-yet-due') throw new Error('unreachable');
        const returnAt = harness.clock.now() + early.retryAfterMs;
        // Whatever comes first on the clock happens first: the live worker's next heartbeat, or the duplicate's return.
        if (nextBeatAt <= returnAt) {
          harness.clock.set(nextBeatAt);
          await fireWhenArmed(timersA);
          expect(named(await settledCommits(a$.results, 2))[1]).toBe('heartbeat committed');
        }
        harness.clock.set(returnAt);
        const again = await runStep(harness.deps('worker-b'), task.task);
        const unit = await readUnit(jobId);

        holdA.release();
        const outcomeOfA = await a;
        await harness.drain();
        expect({ duplicate: again.kind, unitEpoch: unit.epoch, staleReclaims: unit.staleReclaims, liveWorker: outcomeOfA.kind }).toEqual({
          duplicate: 'not-yet-due',
          unitEpoch: 1,
          staleReclaims: 0,
          liveWorker: 'unit-done',
        });
      },
    );

    test('held: a live worker waiting 60 s on one model call (no progress) keeps its unit: every 5 s heartbeat lands and a duplicate task is always told "not yet due"', async () => {
      const holdA = hold();
      unitTurns.run = () => holdThen(holdA, () => Promise.resolve(unitFinished));
      const { jobId, task, a$, timersA, a } = await workerARunsTheUnit(holdA);
      const duplicates: string[] = [];
      for (let beat = 1; beat <= 12; beat += 1) {
        harness.clock.advance(harness.options.heartbeatSeconds * 1000 - 1);
        duplicates.push((await runStep(harness.deps('worker-b'), task.task)).kind);
        harness.clock.advance(1);
        await fireWhenArmed(timersA);
        await settledCommits(a$.results, beat);
      }
      expect(named(await Promise.all(a$.results))).toEqual(Array.from({ length: 12 }, () => 'heartbeat committed'));
      expect(new Set(duplicates)).toEqual(new Set(['not-yet-due']));
      expect(await readUnit(jobId)).toMatchObject({ epoch: 1, staleReclaims: 0 });
      holdA.release();
      expect(await a).toMatchObject({ kind: 'unit-done' });
    });

    test('held: a stale holder after a take-over: its heartbeat (progress, cost, note) is refused and leaves the unit as the new holder wrote it', async () => {
      const holdA = hold();
      const holdB = hold();
      let claims = 0;
      unitTurns.run = async (context) => {
        claims += 1;
        const mine = claims === 1 ? holdA : holdB;
        mine.arrive();
        await mine.released;
        if (claims === 1) {
          context.reportProgress({ stale: 1 });
          context.addCost({ modelCalls: 99 });
          context.note('stale', 'from the old holder');
        }
        return { kind: 'done', state: { value: 1 } };
      };
      const { jobId, task, a$, timersA, a } = await workerARunsTheUnit(holdA);
      // One successful heartbeat first, so that A's session has a cached slot update time (no read before its next commit).
      harness.clock.advance(1_000);
      timersA.fireAll();
      expect(named(await settledCommits(a$.results, 1))).toEqual(['heartbeat committed']);

      harness.clock.advance(takeoverAgeMs(harness.options) + 1);
      const b = runStep(harness.deps('worker-b'), task.task);
      await holdB.entered;
      const taken = await readUnit(jobId);
      expect(taken).toMatchObject({ epoch: 2, lease: { epoch: 2, worker: 'worker-b' } });

      const fired = a$.results.length;
      holdA.release();
      // A's own context calls schedule a flush; fire it.
      for (let spins = 0; timersA.size === 0 && spins < 100; spins += 1) await new Promise((resolve) => setImmediate(resolve));
      timersA.fireAll();
      const outcomeOfA = await a;
      const refused = named(await Promise.all(a$.results.slice(fired)));
      expect(outcomeOfA.kind).toBe('ownership-lost');
      expect(refused.every((outcome) => typeof outcome === 'string' && outcome.startsWith('OwnershipLostError'))).toBe(true);
      expect(await readUnit(jobId)).toEqual(taken);
      holdB.release();
      expect(await b).toMatchObject({ kind: 'unit-done', joined: true });
      expect((await db().collection(`${JOBS}/${jobId}/events`).where('kind', '==', 'stale').get()).size).toBe(0);
      expect((await readJob(jobId)).cost).toEqual({});
    });
  });
});
