/**
 * The apply protocol for one effect, over the ledger and adapter ports (no Firebase here):
 *
 *   planned --(owner-checked)--> applying --apply(intent, key)--> applied | failed | planned | unknown
 *   unknown / applying found at rest --lookup(key)--> see reconcile.ts
 *   applying found at rest, its request maybe still on its way --> left alone until its grace ends
 *
 * The ledger write to `applying` comes before the call, so a worker that dies after the call
 * leaves an entry the next owner reconciles instead of re-sending. An entry is never applied
 * again before a lookup says the target does not have it, or a person says to.
 */
import type { Clock } from '../core/clock';
import { describeError } from '../core/errors';
import { inFlightGraceMs, inFlightUntilMs, type EffectEntry, type EffectLedger } from './ledger';
import type { EffectAdapter } from './port';
import { decideReconcile, type UnknownAnswer } from './reconcile';

/** How settleEffect runs: the claim signal, the clock, retry bounds, and the owner's answers to earlier questions. */
export interface SettleOptions {
  /** Aborted when the claim is lost: no apply starts after that. */
  readonly signal: AbortSignal;
  /** "Now" for the in-flight grace of an entry found `applying`. */
  readonly clock: Clock;
  /** Unusable answers an effect may get in all before a target that never received it is given up on. */
  readonly maxUnknowns: number;
  /** Unknown-then-not-found rounds within one call before the caller is told to pause instead. */
  readonly immediateRetries: number;
  /** The person's answer to the question this entry was raised in, if it was answered. */
  readonly answerFor: (entry: EffectEntry) => UnknownAnswer | null;
  readonly note?: (kind: string, message: string) => void;
}

/** Where settleEffect left one effect: applied, failed, unavailable, cannot tell (ask a person), stopped, or still in flight. */
export type SettleResult =
  | { readonly kind: 'applied'; readonly entry: EffectEntry }
  /** Not applied and not to be retried: needs a person's attention. */
  | { readonly kind: 'failed'; readonly entry: EffectEntry }
  /** Not applied; the target is down or answers nothing usable: pause and come back. */
  | { readonly kind: 'unavailable'; readonly entry: EffectEntry; readonly reason: string; readonly retryAfterMs: number | null }
  /** Unknown and the lookup failed: a person must decide. */
  | { readonly kind: 'cannot-tell'; readonly entry: EffectEntry; readonly reason: string }
  /** A person said stop. */
  | { readonly kind: 'stop'; readonly entry: EffectEntry }
  /**
   * Found `applying`, and its request may still be on its way (a holder taken over inside a slow
   * send): neither looked up nor sent. Come back at `untilMs`, when a lookup can tell.
   */
  | { readonly kind: 'in-flight'; readonly entry: EffectEntry; readonly untilMs: number };

const REFERENCE = (entry: EffectEntry) => `${entry.intent.kind} ${entry.intent.identity}`;

/** Drives one entry as far as it can go now; every state change is an owner-checked ledger write. */
export async function settleEffect(ledger: EffectLedger, adapter: EffectAdapter, start: EffectEntry, options: SettleOptions): Promise<SettleResult> {
  let entry = start;
  let rounds = 0;
  for (;;) {
    switch (entry.state) {
      case 'applied':
        return { kind: 'applied', entry };
      case 'failed':
        return { kind: 'failed', entry };
      case 'applying':
      case 'unknown': {
        options.signal.throwIfAborted();
        // Its sender may be alive and still inside the call: a lookup now could miss a request on its way, and a retry would send it twice.
        if (entry.state === 'applying') {
          const untilMs = inFlightUntilMs(entry, inFlightGraceMs(adapter.sendTimeoutMs));
          if (options.clock.now() < untilMs) return { kind: 'in-flight', entry, untilMs };
        }
        const answer = options.answerFor(entry);
        const lookup = await adapter.lookup(entry.idempotencyKey, options.signal);
        options.signal.throwIfAborted();
        // An entry found in `applying` was left by a worker that never learned the outcome: count it as unknown.
        const foundInFlight = entry.state === 'applying';
        const decision = decideReconcile({ lookup, unknowns: entry.unknowns + (foundInFlight ? 1 : 0), maxUnknowns: options.maxUnknowns, answer });
        const common = { countLookup: true, countUnknown: foundInFlight, ...(answer === null ? {} : { question: null }) } as const;
        const from = [entry.state];
        switch (decision.action) {
          case 'record-applied':
            entry = await ledger.transition(entry.key, from, {
              ...common,
              state: 'applied',
              evidence: decision.evidence,
              reconciled: true,
              lastOutcome: `found at ${adapter.name} by lookup`,
              ...(answer === null ? {} : { resolution: 'found applied when checked again after the owner decided' }),
            });
            options.note?.('effect-reconciled', `${REFERENCE(entry)}: outcome was unknown; ${adapter.name} has it, recorded as applied`);
            continue;
          case 'retry':
            entry = await ledger.transition(entry.key, from, {
              ...common,
              state: 'planned',
              lastOutcome: decision.reason,
              ...(decision.byDecision ? { resolution: decision.reason } : {}),
            });
            options.note?.('effect-reconciled', `${REFERENCE(entry)}: ${decision.reason}`);
            rounds += 1;
            if (rounds > options.immediateRetries) {
              return { kind: 'unavailable', entry, reason: `${adapter.name} gave no usable answer ${rounds} times in a row`, retryAfterMs: null };
            }
            continue;
          case 'record-not-applied':
            entry = await ledger.transition(entry.key, from, { ...common, state: 'failed', lastOutcome: decision.reason, resolution: decision.reason });
            options.note?.('effect-failed', `${REFERENCE(entry)}: ${decision.reason}`);
            return { kind: 'failed', entry };
          case 'ask':
            entry = await ledger.transition(entry.key, from, { ...common, state: 'unknown', lastOutcome: decision.reason });
            return { kind: 'cannot-tell', entry, reason: decision.reason };
          case 'stop':
            entry = await ledger.transition(entry.key, from, {
              countLookup: true,
              countUnknown: foundInFlight,
              state: decision.confirmedNotApplied ? 'planned' : 'unknown',
              lastOutcome: decision.reason,
              resolution: decision.reason,
            });
            return { kind: 'stop', entry };
        }
        break;
      }
      case 'planned': {
        if (options.answerFor(entry) === 'stop') return { kind: 'stop', entry };
        options.signal.throwIfAborted();
        // Durable before the call: whoever finds it in `applying` later reconciles it.
        entry = await ledger.transition(entry.key, ['planned'], { state: 'applying', countAttempt: true, lastOutcome: `sending to ${adapter.name}` });
        options.signal.throwIfAborted();
        let outcome;
        try {
          outcome = await adapter.apply(entry.intent, entry.idempotencyKey, options.signal);
        } catch (error) {
          // An adapter that throws breaks the port's contract; the outcome is unknown all the same.
          outcome = { kind: 'unknown' as const, reason: `the adapter threw: ${describeError(error)}` };
        }
        // A claim lost during the call: this worker may not write; the entry stays `applying` for the next owner.
        options.signal.throwIfAborted();
        switch (outcome.kind) {
          case 'applied':
            entry = await ledger.transition(entry.key, ['applying'], { state: 'applied', evidence: outcome.evidence, reconciled: false, lastOutcome: `applied by ${adapter.name}` });
            continue;
          case 'rejected':
            entry = await ledger.transition(entry.key, ['applying'], { state: 'failed', lastOutcome: `refused by ${adapter.name}: ${outcome.reason}` });
            options.note?.('effect-failed', `${REFERENCE(entry)}: refused by ${adapter.name} (${outcome.reason})`);
            return { kind: 'failed', entry };
          case 'unavailable':
            entry = await ledger.transition(entry.key, ['applying'], { state: 'planned', lastOutcome: `not applied: ${outcome.reason}` });
            return { kind: 'unavailable', entry, reason: outcome.reason, retryAfterMs: outcome.retryAfterMs ?? null };
          case 'unknown':
            entry = await ledger.transition(entry.key, ['applying'], { state: 'unknown', countUnknown: true, lastOutcome: `outcome unknown: ${outcome.reason}` });
            options.note?.('effect-unknown', `${REFERENCE(entry)}: outcome unknown (${outcome.reason}); checking with ${adapter.name}`);
            continue;
        }
      }
    }
  }
}
