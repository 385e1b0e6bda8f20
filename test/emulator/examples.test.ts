/**
 * The examples in examples/ run as written: each through the engine on the Firestore emulator,
 * imported the way a project imports them (they import only 'phaseline').
 */
import { createRefundPipeline, APPROVAL_QUESTION } from '../../examples/approved-refund';
import { outlinePipeline } from '../../examples/plain-pipeline';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { deriveEffectKey } from '../../functions/src/core/effect-keys';
import { decideJob } from '../../functions/src/engine/owner-actions';
import { decodeJob } from '../../functions/src/store/codec';
import { JOBS } from '../../functions/src/store/paths';
import { engineHarness, type EngineHarness } from '../support/engine';
import { applyRequestsFor, httpAdapter, startReceiver, type Receiver } from '../support/receiver';

let receiver: Receiver;
let harness: EngineHarness;
beforeAll(async () => {
  receiver = await startReceiver();
  harness = engineHarness('examples', pipelineRegistry(outlinePipeline, createRefundPipeline(httpAdapter(receiver))));
});
beforeEach(async () => {
  harness.queue.drain();
  receiver.clearFaults();
  await harness.firestore.reset();
});
afterAll(async () => {
  await receiver.stop();
  await harness.firestore.close();
});

const db = () => harness.firestore.db;
const readJob = async (jobId: string) => decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
const resultOf = async (jobId: string) => (await db().doc(`${JOBS}/${jobId}/results/final`).get()).data();
const decide = (jobId: string, questionId: string, answer: string) => decideJob(harness.store, harness.queue, { jobId, owner: 'user-1', questionId, answer });
const refundKey = (jobId: string, orderId: string) => deriveEffectKey(jobId, null, { kind: 'refund', identity: orderId });
/** The refunds the receiver applied for one job (the receiver lives across tests). */
const refundsOf = (jobId: string, orderId: string) => receiver.applied('refund').filter((application) => application.key === refundKey(jobId, orderId));

describe('examples/plain-pipeline.ts', () => {
  test('an outline job completes with one recorded section per point, published as markdown', async () => {
    const jobId = await harness.submit('outline', { topic: 'durable jobs', points: ['leases expire', 'checkpoints hold'] });
    expect((await harness.drain()).at(-1)?.kind).toBe('completed');
    expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete', progress: { sectionsTotal: 2, sectionsDone: 2 } });
    expect((await db().collection(`${JOBS}/${jobId}/sections`).get()).size).toBe(2);
    expect(await resultOf(jobId)).toMatchObject({
      title: 'Outline: durable jobs',
      markdown: '# Outline: durable jobs\n\n## 1. Leases expire\n\nHow "Leases expire" bears on durable jobs.\n\n## 2. Checkpoints hold\n\nHow "Checkpoints hold" bears on durable jobs.\n',
    });
  });

  test('bad input is refused by its schema with a readable message', () => {
    const parsed = outlinePipeline.input.safeParse({ topic: 'x', points: [] });
    expect(parsed.success).toBe(false);
    expect(parsed.error?.issues.map((issue) => issue.path.join('.'))).toEqual(['points']);
  });
});

describe('examples/approved-refund.ts', () => {
  const order = { orderId: 'order-17', amountCents: 2599, reason: 'arrived broken' };

  test('nothing is refunded before the owner approves; once approved, exactly one refund under the derived key', async () => {
    const jobId = await harness.submit('refund', order);
    expect((await harness.drain()).map((outcome) => outcome.kind)).toEqual(['waiting']);
    expect((await readJob(jobId)).waiting).toMatchObject({ reason: 'decision', questionId: APPROVAL_QUESTION, question: 'Refund $25.99 on order order-17 (arrived broken)?', options: ['approve', 'decline'] });
    expect(applyRequestsFor(receiver, refundKey(jobId, order.orderId))).toBe(0);

    await decide(jobId, APPROVAL_QUESTION, 'approve');
    expect((await harness.drain()).at(-1)?.kind).toBe('completed');
    const key = refundKey(jobId, order.orderId);
    expect(refundsOf(jobId, order.orderId)).toHaveLength(1);
    expect(await resultOf(jobId)).toMatchObject({ title: 'Order order-17: refunded', markdown: `# Order order-17: refunded\n\nrefunded $25.99 under key ${key}\n` });
  });

  test('declined: the job completes and nothing is sent', async () => {
    const jobId = await harness.submit('refund', order);
    await harness.drain();
    await decide(jobId, APPROVAL_QUESTION, 'decline');
    await harness.drain();
    expect(await resultOf(jobId)).toMatchObject({ title: 'Order order-17: not refunded', markdown: '# Order order-17: not refunded\n\ndeclined by the owner\n' });
    expect(applyRequestsFor(receiver, refundKey(jobId, order.orderId))).toBe(0);
  });

  test('an answer lost after the refund was applied is looked up, not sent again', async () => {
    receiver.inject({ op: 'apply', mode: 'apply-then-hang', times: 1 });
    const jobId = await harness.submit('refund', order);
    await harness.drain();
    await decide(jobId, APPROVAL_QUESTION, 'approve');
    expect((await harness.drain()).at(-1)?.kind).toBe('completed');
    const key = refundKey(jobId, order.orderId);
    expect(refundsOf(jobId, order.orderId)).toHaveLength(1);
    expect(applyRequestsFor(receiver, key)).toBe(1);
    expect((await resultOf(jobId))?.title).toBe('Order order-17: refunded');
  });

  test('when nobody can tell, the owner is asked; "retry" sends again under the same key, and the refund is applied once', async () => {
    receiver.inject({ op: 'apply', mode: 'drop-connection', times: 1 });
    receiver.inject({ op: 'lookup', mode: 'drop-connection', times: 1 });
    const jobId = await harness.submit('refund', order);
    await harness.drain();
    await decide(jobId, APPROVAL_QUESTION, 'approve');
    await harness.drain();
    const waiting = (await readJob(jobId)).waiting;
    expect(waiting).toMatchObject({ reason: 'decision', questionId: 'refund-unknown-1', options: ['retry', 'mark-not-applied', 'stop'] });
    expect(waiting?.question).toMatch(/^Nobody can tell whether the refund on order order-17 went through/);

    await decide(jobId, 'refund-unknown-1', 'retry');
    expect((await harness.drain()).at(-1)?.kind).toBe('completed');
    expect(refundsOf(jobId, order.orderId)).toHaveLength(1);
    // The dropped first attempt and the owner's retry, under the same key: the receiver applied one.
    expect(applyRequestsFor(receiver, refundKey(jobId, order.orderId))).toBe(2);
  });
});
