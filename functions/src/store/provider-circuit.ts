/**
 * The provider circuit as one Firestore document per provider, written only on outages and
 * recoveries. Each write is decided from a plain read and committed conditioned on it (created when
 * there was none): no transaction, so a worker that dies between the two holds nothing up, and a
 * change made meanwhile by another worker makes this one read and decide again.
 */
import type { DocumentSnapshot, Firestore } from 'firebase-admin/firestore';
import { z } from 'zod';
import {
  afterOutage,
  circuitState,
  CLOSED_CIRCUIT,
  DEFAULT_CIRCUIT_POLICY,
  needsCloseOnSuccess,
  type CircuitPolicy,
  type CircuitRecord,
  type ProviderCircuit,
} from '../core/circuit';
import { isAlreadyExists, isFailedPrecondition } from './firestore-handle';
import { circuitPath } from './paths';

/** Reads and decisions in a row before a circuit write gives up: each lost race means another worker wrote it. */
const MAX_CIRCUIT_ATTEMPTS = 5;

const circuitSchema = z.object({
  state: z.enum(['closed', 'open']),
  failuresMs: z.array(z.number()),
  untilMs: z.number().nullable(),
  opens: z.number().int(),
  lastDetail: z.string().nullable(),
});

function decode(data: unknown): CircuitRecord {
  const parsed = circuitSchema.safeParse(data);
  // An unreadable circuit document is treated as closed: the circuit only ever protects the provider.
  return parsed.success ? parsed.data : CLOSED_CIRCUIT;
}

/**
 * Writes what `decide` makes of the circuit as read (null: nothing to write), conditioned on that read;
 * a lost race reads and decides again. Resolves to what was written, or null.
 */
async function conditionedWrite(db: Firestore, path: string, decide: (snapshot: DocumentSnapshot) => CircuitRecord | null, stamp: Record<string, unknown>): Promise<CircuitRecord | null> {
  const ref = db.doc(path);
  for (let attempt = 1; ; attempt += 1) {
    const snapshot = await ref.get();
    const next = decide(snapshot);
    if (next === null) return null;
    const document = { ...next, ...stamp };
    const batch = db.batch();
    // Every field of the record is written, so an update is the whole document; a create fails if another worker made it first.
    if (snapshot.exists && snapshot.updateTime) batch.update(ref, document, { lastUpdateTime: snapshot.updateTime });
    else batch.create(ref, document);
    try {
      await batch.commit();
      return next;
    } catch (error) {
      if ((!isFailedPrecondition(error) && !isAlreadyExists(error)) || attempt >= MAX_CIRCUIT_ATTEMPTS) throw error;
    }
  }
}

/** A provider's circuit breaker in Firestore, shared by every worker: one document per provider. */
export function firestoreCircuit(db: Firestore, providerName: string, policy: CircuitPolicy = DEFAULT_CIRCUIT_POLICY): ProviderCircuit {
  const ref = db.doc(circuitPath(providerName.replace(/[^A-Za-z0-9_-]/g, '_')));
  const freshnessMs = policy.readFreshnessMs ?? 0;
  /** The circuit as this process last read or wrote it: steps that start within the freshness window do not read it again. */
  let known: { record: CircuitRecord; atMs: number } | null = null;
  const remember = (record: CircuitRecord, atMs: number): void => {
    known = freshnessMs > 0 ? { record, atMs } : null;
  };
  return {
    async check(nowMs) {
      if (known !== null && nowMs >= known.atMs && nowMs - known.atMs < freshnessMs) return circuitState(known.record, nowMs);
      const snapshot = await ref.get();
      const record = snapshot.exists ? decode(snapshot.data()) : CLOSED_CIRCUIT;
      remember(record, nowMs);
      return circuitState(record, nowMs);
    },
    async recordOutage(nowMs, detail) {
      const decide = (snapshot: DocumentSnapshot) => afterOutage(snapshot.exists ? decode(snapshot.data()) : CLOSED_CIRCUIT, nowMs, policy, detail.slice(0, 500));
      const next = (await conditionedWrite(db, ref.path, decide, { provider: providerName, updatedAtMs: nowMs })) ?? CLOSED_CIRCUIT;
      remember(next, nowMs);
      return circuitState(next, nowMs);
    },
    async recordSuccess(nowMs) {
      const decide = (snapshot: DocumentSnapshot): CircuitRecord | null =>
        snapshot.exists && needsCloseOnSuccess(decode(snapshot.data())) ? { ...CLOSED_CIRCUIT, opens: decode(snapshot.data()).opens } : null;
      const closed = await conditionedWrite(db, ref.path, decide, { provider: providerName, updatedAtMs: nowMs });
      if (closed !== null) remember(closed, nowMs);
    },
  };
}
