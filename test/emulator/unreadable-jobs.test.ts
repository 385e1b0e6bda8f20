/**
 * A job document the codec cannot read (a field of the wrong type, written by hand or by a bug):
 * nothing can be decided from it, so whatever finds it first (its task, a sweep) records why,
 * ends it, acknowledges, and nothing finds it again.
 */
import { WriteBatch } from 'firebase-admin/firestore';
import { UnreadableJobError } from '../../functions/src/core/errors';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { endUnreadableJob } from '../../functions/src/store/unreadable-jobs';
import { runStep } from '../../functions/src/engine/step';
import { sweep, type SweepReport } from '../../functions/src/engine/sweeper';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { heldUnitsPipeline, hold } from '../support/held-units';
import { behaviour, testPipeline } from '../support/test-pipeline';

const held = heldUnitsPipeline('unreadable-units');
let warnings: string[];

const harness = engineSuite('unreadable-jobs', pipelineRegistry(testPipeline, held.pipeline), {
  beforeEach: () => {
    held.turns.reset();
    warnings = [];
  },
});

const db = () => harness.firestore.db;
const jobDoc = (jobId: string) => db().doc(`${JOBS}/${jobId}`);
const sweepIn = (aheadMs: number): Promise<SweepReport> => {
  harness.clock.advance(aheadMs);
  return sweep({ store: harness.store, queue: harness.queue, log: (message, detail) => warnings.push(`${message} ${JSON.stringify(detail)}`) }, harness.clock.now());
};
const DAY_MS = 86_400_000;

/** Breaks one field the codec checks (attempts must be a count): the rest of the document, its status and due times included, stay as the engine wrote them. */
const corrupt = (jobId: string) => jobDoc(jobId).update({ attempts: 'many' });

/** What a person (or the console) sees without the codec: the raw fields the ending wrote, and the timeline's last event. */
async function rawEnding(jobId: string) {
  const snapshot = await jobDoc(jobId).get();
  const events = (await db().collection(`${JOBS}/${jobId}/events`).orderBy('atMs').get()).docs;
  const last = events.at(-1);
  return {
    status: snapshot.get('status') as unknown,
    lease: snapshot.get('lease') as unknown,
    fanout: snapshot.get('fanout') as unknown,
    reason: snapshot.get('quarantine.reason') as unknown,
    lastEvent: { kind: last?.get('kind') as unknown, status: last?.get('status') as unknown },
  };
}

/** No sweep rule, pass or query finds the job again, however much later. */
async function expectNeverFoundAgain(): Promise<void> {
  for (const aheadMs of [60_000, DAY_MS, 30 * DAY_MS]) {
    const report = await sweepIn(aheadMs);
    expect({ found: report.queryDocuments, errors: report.errors, settleFound: report.stoppedEffects.queryDocuments, retentionErrors: report.retention.errors }).toEqual({
      found: 0,
      errors: 0,
      settleFound: 0,
      retentionErrors: 0,
    });
  }
}

test('bug 27: its task records why, quarantines it and is acknowledged (not redelivered); no sweep finds it again', async () => {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  await corrupt(jobId);
  const [task] = harness.queue.drain();
  let outcome: unknown;
  try {
    outcome = await runStep(harness.deps(), task!.task);
  } catch (error) {
    outcome = error; // a throw is an answer Cloud Tasks redelivers, 20 times
  }
  expect(outcome).toMatchObject({ kind: 'not-claimable', reason: expect.stringContaining('attempts') as unknown });
  expect(await rawEnding(jobId)).toEqual({
    status: 'quarantined',
    lease: null,
    fanout: null,
    reason: expect.stringMatching(/document cannot be read.*attempts/s) as unknown,
    lastEvent: { kind: 'quarantined', status: 'quarantined' },
  });
  // A second delivery of the same task is acknowledged at once and writes nothing more.
  const eventsBefore = (await db().collection(`${JOBS}/${jobId}/events`).get()).size;
  expect(await runStep(harness.deps(), task!.task)).toMatchObject({ kind: 'not-claimable' });
  expect((await db().collection(`${JOBS}/${jobId}/events`).get()).size).toBe(eventsBefore);
  await expectNeverFoundAgain();
});

test('bug 27: a running job whose worker died: the sweep that finds its expired lease quarantines it with the reason, once', async () => {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  const [task] = harness.queue.drain();
  const worker = hold();
  behaviour.first = async () => {
    worker.arrive();
    await new Promise<never>(() => undefined); // the worker never comes back
    throw new Error('unreachable');
  };
  void runStep(harness.deps('doomed'), task!.task);
  await worker.entered;
  await corrupt(jobId);
  const first = await sweepIn((harness.options.leaseSeconds + 1) * 1000);
  expect({ quarantined: first.quarantined, errors: first.errors }).toEqual({ quarantined: 1, errors: 0 });
  expect(warnings.join('\n')).toContain(jobId);
  expect(await rawEnding(jobId)).toMatchObject({ status: 'quarantined', lease: null, lastEvent: { kind: 'quarantined' } });
  await expectNeverFoundAgain();
});

test('bug 27: a job in a fan-out whose unit lease expired: the unit is parked, the job quarantined with the reason, and neither is found again', async () => {
  const unitHold = hold();
  held.turns.run = async () => {
    unitHold.arrive();
    return new Promise<never>(() => undefined); // the unit's worker never comes back
  };
  const jobId = await harness.submit('unreadable-units', { units: 1 });
  expect((await harness.drain(1)).map((outcome) => outcome.kind)).toEqual(['fanned-out']);
  const [unitTask] = harness.queue.drain();
  void runStep(harness.deps('doomed'), unitTask!.task);
  await unitHold.entered;
  await corrupt(jobId);
  const first = await sweepIn((harness.options.leaseSeconds + 1) * 1000);
  expect({ parked: first.parkedUnits, quarantined: first.quarantined, errors: first.errors }).toEqual({ parked: 1, quarantined: 1, errors: 0 });
  expect(await rawEnding(jobId)).toMatchObject({ status: 'quarantined', fanout: null, lastEvent: { kind: 'quarantined' } });
  const [unit] = (await db().collection(`${JOBS}/${jobId}/units`).get()).docs;
  expect({ lease: unit?.get('lease') as unknown, why: unit?.get('lastError.message') as unknown }).toEqual({ lease: null, why: expect.stringContaining('cannot be read') as unknown });
  await expectNeverFoundAgain();
});

test('a finder that dies sending the ending (read and decided, commit never sent) holds nothing: the next finder ends the job at once, once', async () => {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  await corrupt(jobId);
  const error = new UnreadableJobError(jobId, 'attempts: expected a count');
  const commit = jest.spyOn(WriteBatch.prototype, 'commit').mockImplementationOnce(() => new Promise(() => undefined));
  void endUnreadableJob(harness.store, error);
  for (let tries = 0; tries < 200 && commit.mock.calls.length === 0; tries += 1) await new Promise((resolve) => setImmediate(resolve));
  expect(commit).toHaveBeenCalledTimes(1);
  commit.mockRestore();

  expect(await endUnreadableJob(harness.store, error)).toBe('quarantined');

  expect(await rawEnding(jobId)).toMatchObject({ status: 'quarantined', lease: null, lastEvent: { kind: 'quarantined', status: 'quarantined' } });
  expect(await endUnreadableJob(harness.store, error)).toBe('unchanged');
});
