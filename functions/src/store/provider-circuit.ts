/** The provider circuit as one Firestore document per provider, written only on outages and recoveries. */
import type { Firestore } from 'firebase-admin/firestore';
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
import { circuitPath } from './paths';

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
      const next = await db.runTransaction(async (tx) => {
        const snapshot = await tx.get(ref);
        const record = afterOutage(snapshot.exists ? decode(snapshot.data()) : CLOSED_CIRCUIT, nowMs, policy, detail.slice(0, 500));
        tx.set(ref, { ...record, provider: providerName, updatedAtMs: nowMs });
        return record;
      });
      remember(next, nowMs);
      return circuitState(next, nowMs);
    },
    async recordSuccess(nowMs) {
      const snapshot = await ref.get();
      if (!snapshot.exists || !needsCloseOnSuccess(decode(snapshot.data()))) return;
      const closed = await db.runTransaction(async (tx) => {
        const current = await tx.get(ref);
        if (!current.exists || !needsCloseOnSuccess(decode(current.data()))) return null;
        const record: CircuitRecord = { ...CLOSED_CIRCUIT, opens: decode(current.data()).opens };
        tx.set(ref, { ...record, provider: providerName, updatedAtMs: nowMs });
        return record;
      });
      if (closed !== null) remember(closed, nowMs);
    },
  };
}
