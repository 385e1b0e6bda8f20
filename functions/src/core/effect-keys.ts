/**
 * Effect keys: deterministic from the job, the unit and what the effect is (its kind and
 * identity), never from time, attempt or worker, so every retry of the same effect, by any worker,
 * after any crash, sends the same idempotency key. Pure, so they sit in core: the store's ledger
 * (store/firestore-ledger.ts) names its entries by them, and pipelines plan effects with them.
 */
import { createHash } from 'node:crypto';
import type { EffectIntent } from './effect-ledger';

const KEY_VERSION = 'phaseline-effect/v1';

/**
 * The ledger document ID and the idempotency key of an effect. The payload is deliberately not
 * part of it: a re-planned message whose wording changed is still the same message to the same
 * person, and must not get a second key. The ledger keeps the intent recorded first, and refuses a
 * plan under the key whose intent differs from it (intentFingerprint), rather than answering it
 * with the recorded effect.
 */
export function deriveEffectKey(jobId: string, unit: string | null, intent: Pick<EffectIntent, 'kind' | 'identity'>): string {
  const digest = createHash('sha256').update(JSON.stringify([KEY_VERSION, jobId, unit, intent.kind, intent.identity])).digest('hex');
  return `fx_${digest.slice(0, 40)}`;
}

/** JSON with object keys sorted, so equal values always give equal text (Firestore reorders map keys). */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map((item) => canonicalJson(item)).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, item]) => item !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([name, item]) => `${JSON.stringify(name)}:${canonicalJson(item)}`).join(',')}}`;
  }
  return value === undefined ? 'null' : JSON.stringify(value);
}

/** Fingerprint of the whole intent, to notice a plan that would change an effect already recorded. */
export function intentFingerprint(intent: EffectIntent): string {
  return createHash('sha256').update(canonicalJson(intent)).digest('hex').slice(0, 32);
}
