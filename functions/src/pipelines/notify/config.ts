/**
 * Where the deployed notify pipeline sends: configuration only (never the job's input, so a
 * caller cannot point the functions at an address of their choosing).
 */
import { TerminalError } from '../../core/errors';
import { createHttpEffectAdapter } from '../../effects/http-adapter';
import type { StoppedEffectsDeps } from '../../engine/settle-stopped';
import { notifyProgressFromLedger } from './counts';
import { NOTIFY_PIPELINE, type NotifyDeps } from './pipeline';

export const RECEIVER_URL_VARIABLE = 'PHASELINE_RECEIVER_URL';
export const RECEIVER_TIMEOUT_VARIABLE = 'PHASELINE_RECEIVER_TIMEOUT_MS';
export const RECEIVER_WAIT_VARIABLE = 'PHASELINE_RECEIVER_WAIT_SECONDS';

const DEFAULT_TIMEOUT_MS = 10_000;
const DEFAULT_WAIT_SECONDS = 60;

function setting(env: NodeJS.ProcessEnv, name: string): string | undefined {
  const value = env[name]?.trim();
  return value === undefined || value === '' ? undefined : value;
}

function positiveNumber(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = setting(env, name);
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value <= 0) throw new TerminalError(`${name} must be a positive number, got "${raw}"`);
  return value;
}

/** Reads the receiver settings; a missing or malformed one fails the job that needs it, with its name. */
export function notifyDepsFromEnv(env: NodeJS.ProcessEnv = process.env): NotifyDeps {
  const url = setting(env, RECEIVER_URL_VARIABLE);
  if (url === undefined) throw new TerminalError(`${RECEIVER_URL_VARIABLE} is not set: the notify pipeline has no receiver to send through`);
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new TerminalError(`${RECEIVER_URL_VARIABLE} is not a URL: "${url}"`);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new TerminalError(`${RECEIVER_URL_VARIABLE} must be an http(s) URL, got "${url}"`);
  return {
    adapter: createHttpEffectAdapter({ baseUrl: url, timeoutMs: positiveNumber(env, RECEIVER_TIMEOUT_VARIABLE, DEFAULT_TIMEOUT_MS), name: `the receiver at ${parsed.host}` }),
    unavailableWaitMs: positiveNumber(env, RECEIVER_WAIT_VARIABLE, DEFAULT_WAIT_SECONDS) * 1000,
  };
}

let configured: NotifyDeps | undefined;

/** Built on first use, when a step needs it. */
export function configuredNotifyDeps(): NotifyDeps {
  configured ??= notifyDepsFromEnv();
  return configured;
}

/**
 * How the sweeper checks a stopped notify job's effects: through the same receiver the job sent
 * them to, with the item counts recomputed from the ledger. Resolved when a stopped notify job is
 * found (so a missing receiver setting is reported then, by name), null for other pipelines.
 */
export function notifyStoppedEffects(deps: () => NotifyDeps = configuredNotifyDeps): StoppedEffectsDeps['settlerFor'] {
  return (pipeline) => (pipeline === NOTIFY_PIPELINE ? { adapter: deps().adapter, progress: notifyProgressFromLedger } : null);
}
