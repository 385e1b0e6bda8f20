/**
 * A provider circuit shared by every worker: when outages pile up it opens, and new work waits
 * (visibly, `waiting` with "provider unavailable") instead of hammering the provider. Once the
 * cool-down passes, the next calls are probes: a success closes it, an outage opens it again.
 * The port and its pure decisions live here; the shared document is store/provider-circuit.ts.
 */
export interface CircuitState {
  readonly open: boolean;
  /** When an open circuit lets probes through; null when closed. */
  readonly untilMs: number | null;
  /**
   * Whether a success has anything to close (the circuit is open or counting outages). Absent means
   * unknown: a success is then reported.
   */
  readonly needsClose?: boolean;
}

/** A circuit breaker shared by every worker of a provider: while it is open, agent phases wait instead of calling a provider that is down. */
export interface ProviderCircuit {
  check(nowMs: number): Promise<CircuitState>;
  /** Counts an outage seen by a worker (after its own in-call retries); may open the circuit. */
  recordOutage(nowMs: number, detail: string): Promise<CircuitState>;
  /** A call succeeded: closes a circuit that was open or counting. Writes only when something changes. */
  recordSuccess(nowMs: number): Promise<void>;
}

export interface CircuitPolicy {
  /** Outages within `windowMs` that open the circuit. */
  readonly failureThreshold: number;
  readonly windowMs: number;
  readonly coolDownMs: number;
  /**
   * How long one process trusts the circuit as it last read or wrote it before reading it again
   * (0 or absent: every check reads). A circuit another worker opened meanwhile is seen at most
   * this late, or at this worker's own next outage.
   */
  readonly readFreshnessMs?: number;
}

export const DEFAULT_CIRCUIT_POLICY: CircuitPolicy = { failureThreshold: 3, windowMs: 60_000, coolDownMs: 60_000, readFreshnessMs: 5_000 };

export interface CircuitRecord {
  readonly state: 'closed' | 'open';
  /** Times of recent outages, newest last, within the window. */
  readonly failuresMs: readonly number[];
  readonly untilMs: number | null;
  readonly opens: number;
  readonly lastDetail: string | null;
}

export const CLOSED_CIRCUIT: CircuitRecord = { state: 'closed', failuresMs: [], untilMs: null, opens: 0, lastDetail: null };

export function circuitState(record: CircuitRecord, nowMs: number): CircuitState {
  const open = record.state === 'open' && record.untilMs !== null && nowMs < record.untilMs;
  return { open, untilMs: open ? record.untilMs : null, needsClose: needsCloseOnSuccess(record) };
}

/** The record after one more outage: opened when the window holds enough of them, or when a probe failed. */
export function afterOutage(record: CircuitRecord, nowMs: number, policy: CircuitPolicy, detail: string): CircuitRecord {
  const failuresMs = [...record.failuresMs.filter((at) => at > nowMs - policy.windowMs), nowMs].slice(-policy.failureThreshold * 4);
  const probing = record.state === 'open' && record.untilMs !== null && nowMs >= record.untilMs;
  const stillOpen = record.state === 'open' && !probing;
  if (stillOpen) return { ...record, failuresMs, lastDetail: detail };
  if (probing || failuresMs.length >= policy.failureThreshold) {
    return { state: 'open', failuresMs, untilMs: nowMs + policy.coolDownMs, opens: record.opens + 1, lastDetail: detail };
  }
  return { ...record, failuresMs, lastDetail: detail };
}

export function needsCloseOnSuccess(record: CircuitRecord): boolean {
  return record.state === 'open' || record.failuresMs.length > 0;
}
