/**
 * The publication reads the unresolved effects and the outbox plainly (side by side) and commits
 * conditioned on the job alone. These tests put writes between those reads and the commit (right
 * after the outbox read, the last one): an owner's cancel, an effect moved under an earlier or the
 * current claim, an answer already published; and a failing outbox read beside an unresolved effect.
 */
import { Timestamp, type DocumentReference, type DocumentSnapshot } from 'firebase-admin/firestore';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { UNRESOLVED_EFFECT_STATES } from '../../functions/src/effects/ledger';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { canaryPipeline } from '../../functions/src/pipelines/canary';
import { firestoreEffectLedger } from '../../functions/src/store/firestore-ledger';
import { JOBS, resultPath } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { afterFirstGet, whileInterposed } from '../support/interpose';
import { testPipeline } from '../support/test-pipeline';

const harness = engineSuite('publication', pipelineRegistry(canaryPipeline, testPipeline));

const db = () => harness.firestore.db;
const text = 'One paragraph here.\n\nAnd a second one.';
/** Runs `during` once, right after the publication's read of the outbox (the last read before its commit). */
const afterOutboxRead = (outbox: DocumentReference, during: () => Promise<void>) => afterFirstGet(db(), outbox.path, during);

/** Runs the canary up to (not including) its publication step. */
async function upToPublication(): Promise<string> {
  const jobId = await harness.submit('canary', { text });
  const outcomes = await harness.drain(5);
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'fanned-out', 'unit-done', 'unit-done', 'handed-off']);
  return jobId;
}

/** The job's effect ledger as a step holding `claim` gets it. */
const ledgerUnder = (claim: { jobId: string; epoch: number }) =>
  firestoreEffectLedger({
    db: db(),
    jobId: claim.jobId,
    unit: null,
    epoch: claim.epoch,
    clock: harness.clock,
    signal: new AbortController().signal,
    commit: (decide) => harness.store.apply({ kind: 'job', claim }, decide),
  });

test('the owner cancels between the publication\'s reads and its commit: the job ends cancelled, nothing is published', async () => {
  const jobId = await upToPublication();
  const outbox = db().doc(resultPath(jobId));
  const interposed = afterOutboxRead(outbox, async () => {
    await cancelJob(harness.store, { jobId, owner: 'user-1', reason: 'too slow' });
  });
  const last = await whileInterposed(interposed, () => harness.drain());
  expect(interposed.ran()).toBe(true);
  expect(last.map((outcome) => outcome.kind)).toEqual(['ownership-lost']);
  expect((await outbox.get()).exists).toBe(false);
  expect((await harness.readJob(jobId)).status).toBe('cancelled');
});

test("an effect moved under the claim of the step before, between the publication's effect query and its commit, is refused: the job completes with nothing unresolved", async () => {
  const jobId = await upToPublication();
  // An effect applied earlier in the job left its entry and its settle mark (firestore-ledger.ts sets the mark once, on the first `applying`).
  const before = await harness.readJob(jobId);
  const earlier = { jobId, epoch: before.epoch };
  await db().doc(`${JOBS}/${jobId}`).update({ effectsToSettleAt: Timestamp.fromMillis(harness.clock.now()) });
  const outbox = db().doc(resultPath(jobId));
  let refusal: unknown = null;
  const interposed = afterOutboxRead(outbox, async () => {
    // Only a claim other than the publishing one can hold a ledger (the publishing step's context refuses effects):
    // the step that handed off to the publication, still running one, is refused by the ledger's own owner check.
    await ledgerUnder(earlier)
      .plan([{ kind: 'email', identity: 'late-one', target: 'mailto:someone@example.com', payload: { subject: 'hello' } }])
      .catch((error: unknown) => {
        refusal = error;
      });
  });
  const last = await whileInterposed(interposed, () => harness.drain());
  expect(interposed.ran()).toBe(true);
  expect(String(refusal)).toMatch(/no longer owns/);
  const unresolved = await db().collection(`${JOBS}/${jobId}/effects`).where('state', 'in', [...UNRESOLVED_EFFECT_STATES]).get();
  expect(unresolved.size).toBe(0);
  expect(last.at(-1)?.kind).toBe('completed');
});

test("the publishing step's context refuses effects: no ledger write can hold the publishing claim", async () => {
  const jobId = await upToPublication();
  let refusal: unknown = null;
  const publishing = pipelineRegistry({
    ...canaryPipeline,
    publish: (context) => {
      // A pipeline that tries to act while publishing: the ledger it gets refuses before anything is written.
      context.effects.plan([{ kind: 'email', identity: 'while-publishing', target: 'mailto:someone@example.com', payload: {} }]).catch((error: unknown) => {
        refusal = error;
      });
      return canaryPipeline.publish(context);
    },
  });
  const outcome = await runStep(harness.deps('publisher', { pipelines: publishing }), harness.queue.tasks.shift()!.task);
  await new Promise((resolve) => setImmediate(resolve));
  expect(outcome.kind).toBe('completed');
  expect(String(refusal)).toMatch(/publication/);
  expect((await db().collection(`${JOBS}/${jobId}/effects`).get()).size).toBe(0);
});

test('an effect that goes in flight under the current claim between the effect query and the commit, on a job not yet marked: the mark fences it, the job does not complete', async () => {
  const jobId = await upToPublication();
  const outbox = db().doc(resultPath(jobId));
  const interposed = afterOutboxRead(outbox, async () => {
    const job = await harness.readJob(jobId);
    const ledger = ledgerUnder({ jobId, epoch: job.epoch });
    const [entry] = await ledger.plan([{ kind: 'email', identity: 'late-one', target: 'mailto:someone@example.com', payload: { subject: 'hello' } }]);
    await ledger.transition(entry!.key, ['planned'], { state: 'applying', countAttempt: true, lastOutcome: 'sending' });
  });
  const last = await whileInterposed(interposed, () => harness.drain());
  expect(interposed.ran()).toBe(true);
  const job = await harness.readJob(jobId);
  expect(job.status).not.toBe('completed');
  expect(last.at(-1)?.kind).toBe('failed');
  expect((await outbox.get()).exists).toBe(false);
});

test('an answer that appears between the publication\'s read of the outbox and its commit is kept, not published twice', async () => {
  const jobId = await harness.submit('canary', { text });
  const outcomes = await harness.drain(4); // split, fan-out, both units
  expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'fanned-out', 'unit-done', 'unit-done']);
  const outbox = db().doc(resultPath(jobId));
  const interposed = afterFirstGet(db(), outbox.path, () => outbox.create({ jobId, markdown: 'published by an earlier holder', outcome: 'complete' }));
  const last = await whileInterposed(interposed, () => harness.drain());
  expect(interposed.ran()).toBe(true);
  expect(last.at(-1)?.kind).toBe('completed');
  expect((await outbox.get()).get('markdown')).toBe('published by an earlier holder');
  expect((await db().doc(`${JOBS}/${jobId}`).get()).get('status')).toBe('completed');
});

test('publication with an unresolved effect fails the job with UnresolvedEffectsError, whatever the outbox read beside it does', async () => {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  // Both phases checkpointed; the next step publishes.
  expect((await harness.drain(2)).map((outcome) => outcome.kind)).toEqual(['handed-off', 'handed-off']);
  await db().doc(`${JOBS}/${jobId}/effects/notify-1`).set({ state: 'unknown', key: 'notify-1' });
  const outbox = `${JOBS}/${jobId}/results/final`;
  const prototype = Object.getPrototypeOf(db().doc(outbox)) as { get: (this: DocumentReference) => Promise<DocumentSnapshot> };
  const get = prototype.get;
  const failingOutbox = jest.spyOn(prototype, 'get').mockImplementation(async function (this: DocumentReference) {
    if (this.path === outbox) throw Object.assign(new Error('7 PERMISSION_DENIED: injected read failure'), { code: 7 });
    return get.call(this);
  });
  const [task] = harness.queue.drain();
  let outcome: StepOutcome | { kind: 'threw'; message: string };
  try {
    outcome = await runStep(harness.deps('publisher'), task!.task);
  } catch (error) {
    outcome = { kind: 'threw', message: error instanceof Error ? error.message : String(error) };
  } finally {
    failingOutbox.mockRestore();
  }
  // The ledger read beside the failed outbox read may still be in flight: let it land before the client closes.
  await new Promise((resolve) => setTimeout(resolve, 1_000));
  expect(outcome).toMatchObject({ kind: 'failed' });
  const job = await harness.readJob(jobId);
  expect(job.status).toBe('failed');
  expect(job.lastError?.message).toMatch(/Cannot complete while effects are unresolved .*notify-1/);
});
