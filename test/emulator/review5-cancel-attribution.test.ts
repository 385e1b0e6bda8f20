/**
 * Review 5, claim 4 on the emulator: who a cancel is attributed to, through the engine's own paths
 * (the owner's cancel, the spend-limit cancel through the budget question, an operator's cancel on
 * the owner's behalf), in the stored record, its timeline event and the re-drive refusal.
 */
import { SpendLimitReachedError } from '../../functions/src/core/errors';
import { BUDGET_CANCEL, BUDGET_QUESTION_ID } from '../../functions/src/core/lifecycle';
import { cancelJob, decideJob } from '../../functions/src/engine/owner-actions';
import { OperatorActionRefusedError, redriveJob } from '../../functions/src/engine/operator';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS, jobPath } from '../../functions/src/store/paths';
import { engineHarness, type EngineHarness } from '../support/engine';
import { behaviour, resetBehaviour, testPipelines } from '../support/test-pipeline';

let harness: EngineHarness;
beforeAll(() => {
  harness = engineHarness('review5-cancel', testPipelines);
});
beforeEach(async () => {
  resetBehaviour();
  harness.queue.drain();
  await harness.firestore.reset();
});
afterAll(() => harness.firestore.close());

const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(jobPath(jobId)).get()).data());
const cancelEvents = async (jobId: string) =>
  (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.filter((doc) => doc.get('kind') === 'cancelled').map((doc) => doc.get('message') as string);

/** A job that ran its first phase into the owner's daily cap: waiting with the budget question. */
async function waitingAtCap(): Promise<string> {
  behaviour.first = () => Promise.reject(new SpendLimitReachedError('Daily spend limit reached.', 5, 5, harness.clock.now() + 3_600_000));
  const jobId = await harness.submit('two-phase', { sections: 1 });
  expect((await harness.drain(1))[0]).toMatchObject({ kind: 'waiting', reason: 'budget' });
  expect((await readJob(jobId)).waiting).toMatchObject({ reason: 'budget', questionId: BUDGET_QUESTION_ID });
  return jobId;
}

test("the owner's cancel at the spend limit (the budget question's cancel) is the owner's: no operator, and its words say so", async () => {
  const jobId = await waitingAtCap();
  const cancelled = await decideJob(harness.store, harness.queue, { jobId, owner: 'user-1', questionId: BUDGET_QUESTION_ID, answer: BUDGET_CANCEL });
  expect(cancelled.status).toBe('cancelled');
  const job = await readJob(jobId);
  expect(job.cancellation).toMatchObject({ by: null, reason: 'stopped by its owner at the daily spend limit', phase: null });
  expect(await cancelEvents(jobId)).toEqual(['Cancelled by its owner during its first step (stopped by its owner at the daily spend limit).']);
  await expect(redriveJob(harness.store, harness.queue, { jobId, fromPhase: 'first', by: 'op-bob', reason: 'try again' }, harness.clock.now(), { pipelines: testPipelines })).rejects.toThrow(
    /was cancelled by its owner/,
  );
});

test("an operator's cancel of a job waiting at its owner's cap names the operator everywhere, never the owner", async () => {
  const jobId = await waitingAtCap();
  const { job } = await cancelJob(harness.store, { jobId, owner: 'user-1', reason: 'runaway spend', by: 'op-alice' });
  expect(job.cancellation).toMatchObject({ by: 'op-alice', reason: 'runaway spend' });
  expect((await readJob(jobId)).cancellation).toMatchObject({ by: 'op-alice', reason: 'runaway spend' });
  const [event] = await cancelEvents(jobId);
  expect(event).toBe('Cancelled by operator op-alice during its first step (runaway spend).');
  expect(event).not.toMatch(/its owner/);
  const refusal = redriveJob(harness.store, harness.queue, { jobId, fromPhase: 'first', by: 'op-bob', reason: 'try again' }, harness.clock.now(), { pipelines: testPipelines });
  await expect(refusal).rejects.toBeInstanceOf(OperatorActionRefusedError);
  await expect(refusal).rejects.toThrow(/was cancelled by operator op-alice/);
});

test("the owner's own cancel of a queued job stores no operator", async () => {
  const jobId = await harness.submit('two-phase', { sections: 1 });
  await cancelJob(harness.store, { jobId, owner: 'user-1', reason: 'changed my mind' });
  const job = await readJob(jobId);
  expect(job.cancellation).toMatchObject({ by: null, reason: 'changed my mind', phase: null });
  expect(await cancelEvents(jobId)).toEqual(['Cancelled by its owner during its first step (changed my mind).']);
  // The stored map carries `by: null`, not a missing key (readers of the raw document see it either way).
  expect((await db().doc(jobPath(jobId)).get()).get('cancellation.by')).toBeNull();
});
