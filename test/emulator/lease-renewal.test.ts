/**
 * The default lease is 90 s (heartbeat 5 s, stale takeover 10 s, progress
 * timeout 150 s), and "a live holder never loses its lease to the sweeper". On the injected clock:
 *
 *   - held: a job phase (and a fan-out unit) that waits on one long call for 145 s, heartbeating
 *     every 5 s, is never reclaimed by the sweeper, and finishes;
 *   - a fan-out unit's finishing commit runs after its flusher stopped (no heartbeat), and retries
 *     against its siblings' job writes up to 8 + 2 × units times: a live unit that keeps losing
 *     that race for longer than the lease is reclaimed by the sweeper, and its finished work is
 *     thrown away.
 */
import { FieldValue } from 'firebase-admin/firestore';
import type { DocumentReference, DocumentSnapshot, ReadOptions } from 'firebase-admin/firestore';
import { DEFAULT_ENGINE_OPTIONS } from '../../functions/src/core/options';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { sweep, type SweepReport } from '../../functions/src/engine/sweeper';
import { decodeJob, decodeUnit } from '../../functions/src/store/codec';
import { jobPath, JOBS } from '../../functions/src/store/paths';
import { engineSuite, gate } from '../support/engine';
import { heldUnitsPipeline } from '../support/held-units';
import { behaviour, testPipeline } from '../support/test-pipeline';
import { ManualTimers } from '../support/timers';

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
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(jobPath(jobId)).get()).data());
const sweepNow = (): Promise<SweepReport> => sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());

async function waitUntil(probe: () => Promise<boolean>): Promise<void> {
  for (let tries = 0; tries < 4_000; tries += 1) {
    if (await probe()) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  throw new Error('condition never held');
}

test('the options under review', () => {
  expect(harness.options).toMatchObject({ leaseSeconds: 90, heartbeatSeconds: 5, staleHeartbeatSeconds: 10, progressTimeoutSeconds: 150 });
  expect(DEFAULT_ENGINE_OPTIONS.leaseSeconds).toBe(90);
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
