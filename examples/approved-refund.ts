/**
 * Example (c): an external effect that a person approves first. A refund is asked for; the job
 * waits until its owner answers (decideJob), then applies the refund through the effect ledger
 * under an idempotency key derived from the job and the order: a crash, a redelivered task or a
 * second worker never refunds twice, and a refund whose outcome is unknown is looked up at the
 * payment system before anything is sent again. If nobody can tell, the owner is asked.
 *
 * Deploy: createPhaseline({ pipelines: [refund], effectsAfterStop: { refund: () => ({ adapter }) } }),
 * where `refund = createRefundPipeline(adapter)` (for an HTTP system of record:
 * createHttpEffectAdapter), so effects of a job cancelled mid-send are checked afterwards too.
 */
import { z } from 'zod';
import { TerminalError, definePhase, definePipeline, settleEffect, type EffectAdapter, type EffectEntry, type UnknownAnswer } from 'phaseline';

const refundInput = z.strictObject({ orderId: z.string().regex(/^[A-Za-z0-9-]{1,40}$/), amountCents: z.number().int().positive().max(1_000_000), reason: z.string().trim().min(1).max(200) });
type RefundInput = z.infer<typeof refundInput>;

export const APPROVAL_QUESTION = 'approve-refund';
export const UNKNOWN_QUESTION = 'refund-unknown';
const UNKNOWN_ANSWERS: readonly UnknownAnswer[] = ['retry', 'mark-not-applied', 'stop'];
const money = (cents: number) => `$${(cents / 100).toFixed(2)}`;

const approve = definePhase<RefundInput, { approved: boolean }>({
  name: 'approve',
  state: z.object({ approved: z.boolean() }),
  run: (context) => {
    const answer = context.decisions[APPROVAL_QUESTION];
    if (answer !== undefined) return Promise.resolve({ kind: 'done', state: { approved: answer === 'approve' } });
    const { orderId, amountCents, reason } = context.input;
    // No timeout: a question never times out into a default.
    return Promise.resolve({ kind: 'wait', reason: 'decision', questionId: APPROVAL_QUESTION, question: `Refund ${money(amountCents)} on order ${orderId} (${reason})?`, options: ['approve', 'decline'] });
  },
});

const refundState = z.object({ refunded: z.boolean(), detail: z.string() });

export function createRefundPipeline(adapter: EffectAdapter) {
  const refund = definePhase<RefundInput, z.infer<typeof refundState>>({
    name: 'refund',
    state: refundState,
    needs: [approve],
    run: async (context) => {
      if (!context.checkpoint(approve).approved) return { kind: 'done', state: { refunded: false, detail: 'declined by the owner' } };
      const { orderId, amountCents } = context.input;
      // Planned first (first write wins), so every later step finds the same entry and key.
      const [planned] = await context.effects.plan([{ kind: 'refund', identity: orderId, target: `orders/${orderId}`, payload: { amountCents } }]);
      if (!planned) throw new TerminalError('the ledger returned no entry for the planned refund');
      const answerFor = (entry: EffectEntry) => UNKNOWN_ANSWERS.find((answer) => entry.question !== null && context.decisions[entry.question] === answer) ?? null;
      const result = await settleEffect(context.effects, adapter, planned, { signal: context.signal, clock: context.clock, maxUnknowns: 5, immediateRetries: 2, answerFor });
      switch (result.kind) {
        case 'applied':
          return { kind: 'done', state: { refunded: true, detail: `refunded ${money(amountCents)} under key ${result.entry.idempotencyKey}` } };
        case 'failed':
          return { kind: 'done', state: { refunded: false, detail: result.entry.resolution ?? result.entry.lastOutcome ?? 'refused' } };
        case 'in-flight': // an earlier worker's request may still be on its way: look it up once it cannot be
          return { kind: 'yield', untilMs: result.untilMs };
        case 'unavailable':
          return { kind: 'wait', reason: 'provider', questionId: 'payments-down', question: `${adapter.name} is unavailable: ${result.reason}`, untilMs: context.clock.now() + Math.max(60_000, result.retryAfterMs ?? 0) };
        case 'stop':
          throw new TerminalError(`Stopped by the owner; the refund on order ${orderId} may or may not have gone through`);
        case 'cannot-tell': {
          // A new question each time (an earlier answer was for an earlier unknown), tagged on the entry so the answer applies to it.
          const questionId = `${UNKNOWN_QUESTION}-${Object.keys(context.decisions).filter((id) => id.startsWith(UNKNOWN_QUESTION)).length + 1}`;
          await context.effects.transition(result.entry.key, ['unknown'], { state: 'unknown', question: questionId, lastOutcome: result.reason });
          return { kind: 'wait', reason: 'decision', questionId, question: `Nobody can tell whether the refund on order ${orderId} went through (${result.reason}).`, options: UNKNOWN_ANSWERS };
        }
      }
    },
  });

  return definePipeline<RefundInput>({
    name: 'refund',
    description: 'A refund applied once, through the effect ledger, after its owner approves it.',
    input: refundInput,
    phases: [approve, refund],
    publish: (context) => {
      const { refunded, detail } = context.checkpoint(refund);
      const title = `Order ${context.input.orderId}: ${refunded ? 'refunded' : 'not refunded'}`;
      return { outcome: 'complete', title, markdown: `# ${title}\n\n${detail}\n`, missing: [] };
    },
  });
}
