/**
 * The effect ledger as phases see it: one entry per external effect (a message, a payment, a
 * post) under `jobs/{jobId}/effects/{effectKey}`, recorded before the effect is attempted and
 * moved through its states only by the current owner of the claim.
 *
 *   planned  -> applying                 the owner is about to call the target (attempts + 1)
 *   applying -> applied                  the target answered with evidence
 *   applying -> failed                   the target refused it for good (nothing was applied)
 *   applying -> planned                  the target was provably unavailable (nothing was applied)
 *   applying -> unknown                  no usable answer: a timeout, a dropped connection, a crash
 *   unknown  -> applied | planned        reconciled by a lookup: found, or not found (same key is safe)
 *   unknown  -> failed                   a person said "mark it as not applied", or retries ran out
 *
 * An entry found in `applying` by anyone but the worker that wrote it is treated as `unknown`.
 * It lives in core because the step context (core/pipeline) and the job record (core/job) name
 * its types; it has no Firebase import: the Firestore implementation is store/firestore-ledger.ts.
 */
import { z } from 'zod';
import { RetryableError, TerminalError } from './errors';

/** An effect ledger entry's states: planned, applying (sent, answer not yet recorded), applied, unknown, failed. */
export const EFFECT_STATES = ['planned', 'applying', 'applied', 'unknown', 'failed'] as const;
/** One of EFFECT_STATES. */
export type EffectState = (typeof EFFECT_STATES)[number];

/** States whose outcome nobody knows yet: a job cannot complete while an entry is in one. */
export const UNRESOLVED_EFFECT_STATES: readonly EffectState[] = ['applying', 'unknown'];

/** Flat JSON values: what evidence and payload fields hold (Firestore stores them as they are). */
const scalar = z.union([z.string(), z.number(), z.boolean(), z.null()]);
export type EffectScalar = z.infer<typeof scalar>;

/** An effect key (ledger entry ID and idempotency key): `fx_` and 40 hex digits, as deriveEffectKey makes them. */
export const effectKeySchema = z.string().regex(/^fx_[0-9a-f]{40}$/, 'an effect key is fx_ and 40 hex digits');

/**
 * What should happen, validated before it is recorded. `kind` and `identity` name the effect (with
 * the job and unit they give its key); `target` and `payload` say what to do.
 */
export const effectIntentSchema = z.strictObject({
  kind: z.string().regex(/^[a-z][a-z0-9-]{0,39}$/, 'kind must be a short kebab-case word'),
  /** What the effect is about, stable across re-planning (for example campaign and recipient). */
  identity: z.string().min(1).max(300),
  target: z.string().min(1).max(500),
  payload: z.record(z.string(), scalar),
});
/** What an effect does: its kind, the identity that makes it the same effect across retries, its target and payload. */
export type EffectIntent = z.infer<typeof effectIntentSchema>;

/** What the system of record said about an applied effect (its own ID, when, whether it was a replay). */
export const effectEvidenceSchema = z.record(z.string(), scalar);
/** What the system of record said about an applied effect (its own ID, when), kept in the ledger. */
export type EffectEvidence = z.infer<typeof effectEvidenceSchema>;

export const effectEntrySchema = z.object({
  key: effectKeySchema,
  /** Sent to the target with every apply; the same for every attempt, never derived from time. */
  idempotencyKey: z.string().min(1),
  jobId: z.string(),
  unit: z.string().nullable(),
  intent: effectIntentSchema,
  /** Fingerprint of the whole intent as first recorded; later plans cannot change a recorded effect. */
  intentHash: z.string(),
  state: z.enum(EFFECT_STATES),
  /** Apply requests sent. */
  attempts: z.number().int().nonnegative(),
  /** Times an apply ended without a usable answer. */
  unknowns: z.number().int().nonnegative(),
  lookups: z.number().int().nonnegative(),
  evidence: effectEvidenceSchema.nullable(),
  /** True when the evidence came from a lookup rather than from the apply's own answer. */
  reconciled: z.boolean(),
  /** The last thing that happened to it, for people. */
  lastOutcome: z.string().nullable(),
  /** The question a person was asked about it, while unanswered. */
  question: z.string().nullable(),
  /** How a person (or a reconciliation after the job stopped) settled it. */
  resolution: z.string().nullable(),
  /** Fencing epoch of the claim that wrote it last. */
  epoch: z.number().int().nonnegative(),
  createdAtMs: z.number(),
  updatedAtMs: z.number(),
  /** Set by a cancel that found it in flight. */
  unknownSinceMs: z.number().optional(),
  unknownBecause: z.string().optional(),
});
/** One effect in the ledger: key, intent, state, attempts, evidence, and the question it was raised in. */
export type EffectEntry = z.infer<typeof effectEntrySchema>;

/** A state change of one entry; counters are incremented, absent fields are kept. */
export interface EffectChange {
  readonly state: EffectState;
  readonly lastOutcome: string;
  readonly evidence?: EffectEvidence;
  readonly reconciled?: boolean;
  readonly countAttempt?: boolean;
  readonly countUnknown?: boolean;
  readonly countLookup?: boolean;
  readonly question?: string | null;
  readonly resolution?: string | null;
}

/** The next entry after a change: pure, so the Firestore ledger and the tests agree on it. */
export function applyChange(entry: EffectEntry, change: EffectChange, epoch: number, nowMs: number): EffectEntry {
  const { unknownSinceMs: _since, unknownBecause: _because, ...rest } = entry;
  return effectEntrySchema.parse({
    ...rest,
    state: change.state,
    lastOutcome: change.lastOutcome,
    evidence: change.evidence ?? entry.evidence,
    reconciled: change.reconciled ?? entry.reconciled,
    attempts: entry.attempts + (change.countAttempt ? 1 : 0),
    unknowns: entry.unknowns + (change.countUnknown ? 1 : 0),
    lookups: entry.lookups + (change.countLookup ? 1 : 0),
    question: change.question === undefined ? entry.question : change.question,
    resolution: change.resolution === undefined ? entry.resolution : change.resolution,
    epoch,
    updatedAtMs: nowMs,
  });
}

/**
 * How long past its sender's own deadline a request may still reach its target or be processed
 * there (a slow network, a queue at the target, the sender's clock a little behind the reader's).
 */
export const IN_FLIGHT_MARGIN_MS = 5_000;

/** The grace for an adapter that states no deadline for its requests. */
export const DEFAULT_IN_FLIGHT_GRACE_MS = 60_000;

/**
 * How long an effect last seen in flight may still be applied by the request already sent for it:
 * the sender's deadline for one request plus the margin. Until then a lookup that finds nothing
 * proves nothing (the request may still arrive), so neither a retry nor a write-off may follow it.
 */
export function inFlightGraceMs(sendTimeoutMs: number | undefined): number {
  return sendTimeoutMs === undefined ? DEFAULT_IN_FLIGHT_GRACE_MS : sendTimeoutMs + IN_FLIGHT_MARGIN_MS;
}

/**
 * When an entry's request can no longer be on its way: `graceMs` after the entry was last known in
 * flight (a cancel's mark, else its last write, which for an `applying` entry is the write made just
 * before the request was sent). The one rule for a live job's take-over and a stopped job's pass.
 */
export function inFlightUntilMs(entry: Pick<EffectEntry, 'updatedAtMs' | 'unknownSinceMs'>, graceMs: number): number {
  return (entry.unknownSinceMs ?? entry.updatedAtMs) + graceMs;
}

/** The owner-checked ledger a StepContext offers. Every write throws OwnershipLostError once the claim is gone. */
export interface EffectLedger {
  /** This job's entries (inside a fan-out unit: that unit's), validated; a malformed entry is refused. */
  entries(): Promise<EffectEntry[]>;
  /**
   * Records a `planned` entry for each intent that has none yet, keyed deterministically from
   * job, unit and intent. An entry already recorded with the same intent (same `intentHash`) is
   * returned as it is. One recorded under the key with another intent is a key reused with other
   * parameters: the call is refused with EffectIntentConflictError, the recorded entry is left as it
   * is, and the commit that met it writes nothing (a long plan committed in parts keeps the parts
   * already committed: each is a planned entry of its own, nothing applied). Returns the stored
   * entries in the order of `intents`.
   */
  plan(intents: readonly EffectIntent[]): Promise<EffectEntry[]>;
  /** The entry recorded under the key of this kind and identity (in this job and unit), or null; one document read, nothing written. */
  find(intent: Pick<EffectIntent, 'kind' | 'identity'>): Promise<EffectEntry | null>;
  /** Moves one entry from one of `from` to a new state; EffectStateConflictError if it is in another. */
  transition(key: string, from: readonly EffectState[], change: EffectChange): Promise<EffectEntry>;
}

/** The entry is not in the state the writer expected: re-read the ledger (a fresh step does). */
export class EffectStateConflictError extends RetryableError {
  constructor(message: string) {
    super(message, { code: 'retryable' });
  }
}

/** One planned intent whose key already holds an effect recorded with another intent. */
export interface EffectIntentConflict {
  readonly recorded: EffectEntry;
  readonly planned: EffectIntent;
}

/**
 * A plan named an effect already recorded with another intent (the same kind and identity, so the
 * same key, but another target or payload): the key was reused with other parameters. The recorded
 * effect is what its key means; it is neither changed nor reported as the new intent's own, and
 * nothing of the refused plan was written. No retry makes the two agree, so it is terminal.
 */
export class EffectIntentConflictError extends TerminalError {
  constructor(readonly conflicts: readonly EffectIntentConflict[]) {
    super(
      `Effect ${conflicts.map(({ recorded }) => `${recorded.key} (${recorded.intent.kind} ${JSON.stringify(recorded.intent.identity)}, ${recorded.state})`).join(', ')} ` +
        'is already recorded with another intent: a key is not reused with other parameters, and nothing was planned',
    );
  }
}

/** For contexts that may not touch the ledger (fan-out coordinators, joins, publication). */
export function refusingEffectLedger(who: string): EffectLedger {
  const refuse = () => Promise.reject(new Error(`${who} records no effects`));
  return { entries: refuse, plan: refuse, find: refuse, transition: refuse };
}

export type EffectCounts = Readonly<Record<EffectState, number>>;

export function countEffectStates(entries: Iterable<Pick<EffectEntry, 'state'>>): EffectCounts {
  const counts: Record<EffectState, number> = { planned: 0, applying: 0, applied: 0, unknown: 0, failed: 0 };
  for (const entry of entries) counts[entry.state] += 1;
  return counts;
}
