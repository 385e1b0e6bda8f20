/**
 * The port every effect adapter implements against its system of record. Adapters answer with
 * outcomes, not exceptions: what matters is whether the effect was applied, provably not applied,
 * or nobody can tell, and each adapter knows how its target says which.
 */
import type { EffectEvidence, EffectIntent } from './ledger';

/** What an apply request ended with, as the adapter reads its target. */
export type ApplyOutcome =
  | { readonly kind: 'applied'; readonly evidence: EffectEvidence }
  /** Refused for good (invalid, or the key was used for something else): nothing was applied, retrying will not help. */
  | { readonly kind: 'rejected'; readonly reason: string }
  /** Provably not applied, and the target is down (no connection, or it said 503 / 429): try later. */
  | { readonly kind: 'unavailable'; readonly reason: string; readonly retryAfterMs?: number }
  /** No usable answer: it may or may not have been applied. Reconcile before anything else. */
  | { readonly kind: 'unknown'; readonly reason: string };

/** What a lookup of an idempotency key at the system of record found. */
export type LookupOutcome =
  | { readonly kind: 'found'; readonly evidence: EffectEvidence }
  /** The target has no effect under this key: a retry with the same key is safe. */
  | { readonly kind: 'not-found' }
  /** The lookup itself failed: nobody can tell. */
  | { readonly kind: 'unreachable'; readonly reason: string };

/** The port an effect's system of record is reached through: apply under an idempotency key, and look a key up. */
export interface EffectAdapter {
  /** For people: names the target in questions and reports. */
  readonly name: string;
  /**
   * The longest one apply request may take before the adapter gives up on it (its own deadline).
   * An entry found `applying` is waited out for this long plus a margin (core/effect-ledger.ts
   * `inFlightGraceMs`) before anyone looks it up; a minute when the adapter does not say.
   */
  readonly sendTimeoutMs?: number;
  /** Applies the intent under the idempotency key; the same key must never apply twice. */
  apply(intent: EffectIntent, idempotencyKey: string, signal: AbortSignal): Promise<ApplyOutcome>;
  /** Asks the system of record whether an effect with this key was applied. */
  lookup(idempotencyKey: string, signal: AbortSignal): Promise<LookupOutcome>;
}
