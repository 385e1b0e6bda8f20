/**
 * Where the deployed triage pipeline files tickets: the receiver the deployment configures for
 * effects (the same settings as notify's, config/environment.ts), never the job's input.
 */
import type { EffectAdapter } from '../../effects/port';
import type { Helpdesk } from './pipeline';

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
