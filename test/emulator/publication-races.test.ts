/**
 * The publication reads the unresolved effects and the outbox plainly and commits
 * conditioned on the job alone. These tests interpose writes between those reads and the commit
 * (right after the outbox read, which follows the effects query).
 */
import { Timestamp, type DocumentReference } from 'firebase-admin/firestore';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { canaryPipeline } from '../../functions/src/pipelines/canary';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { runStep } from '../../functions/src/engine/step';
import { firestoreEffectLedger } from '../../functions/src/store/firestore-ledger';
import { UNRESOLVED_EFFECT_STATES } from '../../functions/src/effects/ledger';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS, resultPath } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { afterFirstGet } from '../support/interpose';

const harness = engineSuite('publication-races', pipelineRegistry(canaryPipeline));

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

test('the owner cancels between the publication\'s reads and its commit: the job ends cancelled, nothing is published', async () => {
  const jobId = await upToPublication();
  const outbox = db().doc(resultPath(jobId));
  const interposed = afterOutboxRead(outbox, async () => {
    await cancelJob(harness.store, { jobId, owner: 'user-1', reason: 'too slow' });
  });
  let last;
  try {
    last = await harness.drain();
  } finally {
    interposed.restore();
  }
  expect(interposed.ran()).toBe(true);
  expect(last.map((outcome) => outcome.kind)).toEqual(['ownership-lost']);
  expect((await outbox.get()).exists).toBe(false);
  expect(decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data()).status).toBe('cancelled');
});

test("an effect moved under the claim of the step before, between the publication's effect query and its commit, is refused: the job completes with nothing unresolved", async () => {
  const jobId = await upToPublication();
  // An effect applied earlier in the job left its entry and its settle mark (firestore-ledger.ts sets the mark once, on the first `applying`).
  const before = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  const earlier = { jobId, epoch: before.epoch };
  const ledgerOf = (claim: { jobId: string; epoch: number }) =>
    firestoreEffectLedger({
      db: db(),
      jobId,
      unit: null,
      epoch: claim.epoch,
      clock: harness.clock,
      signal: new AbortController().signal,
      owned: (body) => harness.store.asOwnerReading(claim, body),
    });
  await db().doc(`${JOBS}/${jobId}`).update({ effectsToSettleAt: Timestamp.fromMillis(harness.clock.now()) });
  const outbox = db().doc(resultPath(jobId));
  let refusal: unknown = null;
  const interposed = afterOutboxRead(outbox, async () => {
    // Only a claim other than the publishing one can hold a ledger (the publishing step's context refuses effects):
    // the step that handed off to the publication, still running one, is refused by the ledger's own owner check.
    await ledgerOf(earlier)
      .plan([{ kind: 'email', identity: 'late-one', target: 'mailto:someone@example.com', payload: { subject: 'hello' } }])
      .catch((error: unknown) => {
        refusal = error;
      });
  });
  let last;
  try {
    last = await harness.drain();
  } finally {
    interposed.restore();
  }
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
    const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
    const claim = { jobId, epoch: job.epoch };
    const ledger = firestoreEffectLedger({
      db: db(),
      jobId,
      unit: null,
      epoch: claim.epoch,
      clock: harness.clock,
      signal: new AbortController().signal,
      owned: (body) => harness.store.asOwnerReading(claim, body),
    });
    const [entry] = await ledger.plan([{ kind: 'email', identity: 'late-one', target: 'mailto:someone@example.com', payload: { subject: 'hello' } }]);
    await ledger.transition(entry!.key, ['planned'], { state: 'applying', countAttempt: true, lastOutcome: 'sending' });
  });
  let last;
  try {
    last = await harness.drain();
  } finally {
    interposed.restore();
  }
  expect(interposed.ran()).toBe(true);
  const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  expect(job.status).not.toBe('completed');
  expect(last.at(-1)?.kind).toBe('failed');
  expect((await outbox.get()).exists).toBe(false);
});
