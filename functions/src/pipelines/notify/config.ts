/**
 * Where the deployed notify pipeline sends: configuration only (never the job's input, so a
 * caller cannot point the functions at an address of their choosing).
 */
import { receiverConfigFromEnv, type Environment } from '../../config/environment';
import { createHttpEffectAdapter } from '../../effects/http-adapter';
import type { StoppedEffectsDeps } from '../../engine/settle-stopped';
import { notifyProgressFromLedger } from './counts';
import { NOTIFY_PIPELINE, type NotifyDeps } from './pipeline';

/** For tools that start the functions with a receiver of their own. */
export { RECEIVER_URL_VARIABLE } from '../../config/environment';

/** Reads the receiver settings; a missing or malformed one fails the job that needs it, with its name. */
export function notifyDepsFromEnv(env: Environment = process.env): NotifyDeps {
  const receiver = receiverConfigFromEnv(env);
  return {
    adapter: createHttpEffectAdapter({ baseUrl: receiver.url, timeoutMs: receiver.timeoutMs, name: `the receiver at ${receiver.host}` }),
    unavailableWaitMs: receiver.unavailableWaitMs,
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
