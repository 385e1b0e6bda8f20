/**
 * Where the deployed triage pipeline files tickets: the receiver the deployment configures for
 * effects (the same settings as notify's, config/environment.ts), never the job's input.
 */
import type { EffectAdapter, StoppedEffectsSettler } from '../../api';
import { TRIAGE_PIPELINE, type Helpdesk } from './pipeline';

/** A helpdesk over an effect adapter: a ticket is applied as a `ticket` intent, looked up by its key. */
export function helpdeskFromEffectAdapter(adapter: EffectAdapter): Helpdesk {
  return {
    name: adapter.name,
    ...(adapter.sendTimeoutMs === undefined ? {} : { sendTimeoutMs: adapter.sendTimeoutMs }),
    fileTicket: (ticket, idempotencyKey, signal) =>
      adapter.apply({ kind: 'ticket', identity: ticket.itemId, target: 'helpdesk', payload: { itemId: ticket.itemId, label: ticket.label, summary: ticket.summary } }, idempotencyKey, signal),
    findTicket: (idempotencyKey, signal) => adapter.lookup(idempotencyKey, signal),
  };
}

/**
 * How the sweeper checks a stopped triage job's tickets (a cancel that found one in flight): by
 * looking each key up in the helpdesk. A stopped job files nothing: `apply` refuses.
 */
export function triageStoppedEffects(helpdesk: () => Helpdesk): (pipeline: string) => StoppedEffectsSettler | null {
  return (pipeline) => {
    if (pipeline !== TRIAGE_PIPELINE) return null;
    const desk = helpdesk();
    return {
      adapter: {
        name: desk.name,
        ...(desk.sendTimeoutMs === undefined ? {} : { sendTimeoutMs: desk.sendTimeoutMs }),
        apply: () => Promise.resolve({ kind: 'rejected', reason: 'a stopped job files no tickets' }),
        lookup: (idempotencyKey, signal) => desk.findTicket(idempotencyKey, signal),
      },
    };
  };
}
