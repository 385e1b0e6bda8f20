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
} from '../agent/circuit';
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

export function firestoreCircuit(db: Firestore, providerName: string, policy: CircuitPolicy = DEFAULT_CIRCUIT_POLICY): ProviderCircuit {
  const ref = db.doc(circuitPath(providerName.replace(/[^A-Za-z0-9_-]/g, '_')));
  return {
    async check(nowMs) {
      const snapshot = await ref.get();
      return circuitState(snapshot.exists ? decode(snapshot.data()) : CLOSED_CIRCUIT, nowMs);
    },
    recordOutage(nowMs, detail) {
      return db.runTransaction(async (tx) => {
        const snapshot = await tx.get(ref);
        const next = afterOutage(snapshot.exists ? decode(snapshot.data()) : CLOSED_CIRCUIT, nowMs, policy, detail.slice(0, 500));
        tx.set(ref, { ...next, provider: providerName, updatedAtMs: nowMs });
        return circuitState(next, nowMs);
      });
    },
    async recordSuccess(nowMs) {
      const snapshot = await ref.get();
      if (!snapshot.exists || !needsCloseOnSuccess(decode(snapshot.data()))) return;
      await db.runTransaction(async (tx) => {
        const current = await tx.get(ref);
        if (!current.exists || !needsCloseOnSuccess(decode(current.data()))) return;
        const record = decode(current.data());
        tx.set(ref, { ...CLOSED_CIRCUIT, opens: record.opens, provider: providerName, updatedAtMs: nowMs });
      });
    },
  };
}
