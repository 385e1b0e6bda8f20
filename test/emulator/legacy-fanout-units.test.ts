/**
 * A fan-out recorded without its unit IDs (from before fan-outs listed them) has its units' claim
 * slots revoked only after the commit that ends it. A unit change that does not write the job (a
 * yield, a requeue) is then conditioned on the job itself: a cancel that lands between the unit's
 * read and its commit fails the commit, and the unit of the cancelled job is never queued again.
 */
import { z } from 'zod';
import { FieldValue, type DocumentReference, type DocumentSnapshot, type ReadOptions } from 'firebase-admin/firestore';
import { defineFanOutPhase, definePipeline, pipelineRegistry } from '../../functions/src/core/pipeline';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import { JobStore } from '../../functions/src/store/job-store';
import { JOBS } from '../../functions/src/store/paths';
import { engineSuite, gate } from '../support/engine';

const steppedPipeline = definePipeline<{ units: number }>({
  name: 'legacy-stepped',
  description: 'Test pipeline: fan-out units that yield after each section',
  input: z.strictObject({ units: z.number().int().min(1).max(5) }),
  phases: [
    defineFanOutPhase<{ units: number }, { total: number }, { sum: number }>({
      name: 'count',
      state: z.object({ total: z.number() }),
      section: z.object({ value: z.number() }),
      fanOut: {
        units: (context) => Array.from({ length: context.input.units }, (_, index) => `u${index}`),
        unitState: z.object({ sum: z.number() }),
        runUnit: async (context) => {
          const done = context.sections().length;
          if (done === 3) return { kind: 'done', state: { sum: 3 } };
          await context.recordSection(`n${done}`, { value: done + 1 });
          return { kind: 'yield' };
        },
        join: (results) => ({ total: [...results.values()].reduce((sum, result) => sum + result.sum, 0) }),
      },
    }),
  ],
  publish: (context) => ({ outcome: 'complete', title: 'Sum', markdown: JSON.stringify(context.sections()), missing: [] }),
});

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
