/**
 * Reconciliation decisions, as pure functions: what an effect whose outcome is unknown becomes,
 * given what the system of record says about it and what a person decided, if anyone did.
 *
 * The rule (design rule 8): never retry blindly. A lookup that finds the effect records it as
 * applied, with the target's evidence; a lookup that does not find it makes a retry with the same
 * key safe; a lookup that fails means nobody can tell, and only a person may choose between
 * retrying, writing the effect off, and stopping.
 */
import type { EffectEvidence } from './ledger';
import type { LookupOutcome } from './port';

/** What a person can answer about effects whose outcome could not be checked. */
export type UnknownAnswer = 'retry' | 'mark-not-applied' | 'stop';

export type ReconcileDecision =
  /** Found at the target: applied, whatever anyone said. */
  | { readonly action: 'record-applied'; readonly evidence: EffectEvidence }
  /** Back to `planned` and apply again under the same key. */
  | { readonly action: 'retry'; readonly reason: string; readonly byDecision: boolean }
  /** `failed`: not applied and not to be retried (it needs a person's attention). */
  | { readonly action: 'record-not-applied'; readonly reason: string; readonly byDecision: boolean }
  /** Stays `unknown`: a person must decide. */
  | { readonly action: 'ask'; readonly reason: string }
  /** The person said stop: `planned` if the lookup showed it was not applied, else it stays `unknown`. */
  | { readonly action: 'stop'; readonly confirmedNotApplied: boolean; readonly reason: string };

export interface ReconcileInput {
  readonly lookup: LookupOutcome;
  /** Apply attempts of this effect that ended without a usable answer, this one included. */
  readonly unknowns: number;
  /** After this many, an effect the target never received is written off instead of retried again. */
  readonly maxUnknowns: number;
  /** The person's answer to the question this effect was raised in, if answered. */
  readonly answer: UnknownAnswer | null;
}

export function decideReconcile(input: ReconcileInput): ReconcileDecision {
  const { lookup, answer } = input;
  if (lookup.kind === 'found') return { action: 'record-applied', evidence: lookup.evidence };
  if (lookup.kind === 'not-found') {
    switch (answer) {
      case 'stop':
        return { action: 'stop', confirmedNotApplied: true, reason: 'not found at the target; stopped as the owner decided' };
      case 'mark-not-applied':
        return { action: 'record-not-applied', reason: 'not found at the target; marked not applied as the owner decided', byDecision: true };
      case 'retry':
        return { action: 'retry', reason: 'not found at the target; retried with the same key as the owner decided', byDecision: true };
      case null:
        if (input.unknowns >= input.maxUnknowns) {
          return {
            action: 'record-not-applied',
            reason: `not found at the target after ${input.unknowns} attempts without a usable answer; given up`,
            byDecision: false,
          };
        }
        return { action: 'retry', reason: 'not found at the target: a retry with the same key is safe', byDecision: false };
    }
  }
  const why = `the lookup failed (${lookup.reason})`;
  switch (answer) {
    case 'stop':
      return { action: 'stop', confirmedNotApplied: false, reason: `${why}; stopped as the owner decided` };
    case 'mark-not-applied':
      return { action: 'record-not-applied', reason: `${why}; marked not applied as the owner decided`, byDecision: true };
    case 'retry':
      return { action: 'retry', reason: `${why}; retried with the same key as the owner decided`, byDecision: true };
    case null:
      return { action: 'ask', reason: why };
  }
}
