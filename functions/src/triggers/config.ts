/** Every environment variable the functions read, in one place. All optional; defaults live in core/options. */
import { resolveEngineOptions, type EngineOptions } from '../core/options';

const ENGINE_OPTION_VARIABLES: Readonly<Record<keyof EngineOptions, string>> = {
  leaseSeconds: 'PHASELINE_LEASE_SECONDS',
  heartbeatSeconds: 'PHASELINE_HEARTBEAT_SECONDS',
  staleHeartbeatSeconds: 'PHASELINE_STALE_HEARTBEAT_SECONDS',
  progressTimeoutSeconds: 'PHASELINE_PROGRESS_TIMEOUT_SECONDS',
  progressFlushMs: 'PHASELINE_PROGRESS_FLUSH_MS',
  stepBudgetSeconds: 'PHASELINE_STEP_BUDGET_SECONDS',
  maxAttempts: 'PHASELINE_MAX_ATTEMPTS',
  maxStaleReclaims: 'PHASELINE_MAX_STALE_RECLAIMS',
  backoffBaseSeconds: 'PHASELINE_BACKOFF_BASE_SECONDS',
  backoffMaxSeconds: 'PHASELINE_BACKOFF_MAX_SECONDS',
  lostTaskGraceSeconds: 'PHASELINE_LOST_TASK_GRACE_SECONDS',
  sweepBatchSize: 'PHASELINE_SWEEP_BATCH_SIZE',
  writeRetries: 'PHASELINE_WRITE_RETRIES',
  maxServerDelaySeconds: 'PHASELINE_MAX_SERVER_DELAY_SECONDS',
};

export function engineOptionsFromEnv(env: NodeJS.ProcessEnv = process.env): EngineOptions {
  const overrides: Partial<Record<keyof EngineOptions, number>> = {};
  for (const [option, variable] of Object.entries(ENGINE_OPTION_VARIABLES) as [keyof EngineOptions, string][]) {
    const raw = env[variable];
    if (raw === undefined || raw.trim() === '') continue;
    const value = Number(raw);
    if (!Number.isFinite(value)) throw new Error(`${variable} must be a number, got "${raw}"`);
    overrides[option] = value;
  }
  return resolveEngineOptions(overrides);
}
