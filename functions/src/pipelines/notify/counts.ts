/**
 * Item counts as the job document shows them. An item (one recipient) is `done` once its message
 * is sent and logged, `unknown` while either effect's outcome is unknown, `needsAttention` once
 * either failed for good, and `remaining` otherwise.
 */
import { UNRESOLVED_EFFECT_STATES, type EffectEntry, type EffectState } from '../../api';

export interface ItemCounts {
  readonly total: number;
  readonly done: number;
  readonly remaining: number;
  readonly needsAttention: number;
  readonly unknown: number;
  /** Messages the receiver has (sent), and records logged. */
  readonly sent: number;
  readonly logged: number;
}

export interface ItemEffects {
  readonly send: EffectState | undefined;
  readonly record: EffectState | undefined;
}

export type ItemStatus = 'done' | 'remaining' | 'needsAttention' | 'unknown';

export function itemStatus(item: ItemEffects): ItemStatus {
  const states = [item.send, item.record];
  if (states.some((state) => state !== undefined && UNRESOLVED_EFFECT_STATES.includes(state))) return 'unknown';
  if (states.includes('failed')) return 'needsAttention';
  if (item.send === 'applied' && item.record === 'applied') return 'done';
  return 'remaining';
}

export function countItems(items: Iterable<ItemEffects>): ItemCounts {
  const counts = { total: 0, done: 0, remaining: 0, needsAttention: 0, unknown: 0, sent: 0, logged: 0 };
  for (const item of items) {
    counts.total += 1;
    counts[itemStatus(item)] += 1;
    if (item.send === 'applied') counts.sent += 1;
    if (item.record === 'applied') counts.logged += 1;
  }
  return counts;
}

/** The same counts from the ledger alone (every item's effects are planned before the first is sent). */
export function countItemsFromLedger(entries: readonly EffectEntry[]): ItemCounts {
  const items = new Map<string, { send: EffectState | undefined; record: EffectState | undefined }>();
  for (const entry of entries) {
    const item = items.get(entry.intent.identity) ?? { send: undefined, record: undefined };
    if (entry.intent.kind === 'message') item.send = entry.state;
    else if (entry.intent.kind === 'record') item.record = entry.state;
    items.set(entry.intent.identity, item);
  }
  return countItems(items.values());
}

export function progressOf(counts: ItemCounts): Record<string, number> {
  return { ...counts };
}

/** Progress for reconcileStoppedJob: nothing when the ledger is empty (the job stopped before planning). */
export function notifyProgressFromLedger(entries: readonly EffectEntry[]): Record<string, number> {
  return entries.length === 0 ? {} : progressOf(countItemsFromLedger(entries));
}
