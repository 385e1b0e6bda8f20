/**
 * Where the deployed notify pipeline sends: configuration only (never the job's input, so a
 * caller cannot point the functions at an address of their choosing).
 */
import { createHttpEffectAdapter, receiverConfigFromEnv, type Environment, type StoppedEffectsDeps, type StoppedEffectsSettler } from '../../api';
import { notifyProgressFromLedger } from './counts';
import { NOTIFY_PIPELINE, type NotifyDeps } from './pipeline';

/** For tools that start the functions with a receiver of their own. */
export { RECEIVER_URL_VARIABLE } from '../../api';

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

/**
 * The deployed notify pipeline's settler (createPhaseline's effectsAfterStop): the configured
 * receiver, with the item counts recomputed from the ledger. Resolved when the sweeper finds a
 * stopped notify job, so a missing receiver setting is reported then, by name.
 */
export function notifyEffectsAfterStop(): StoppedEffectsSettler {
  return { adapter: configuredNotifyDeps().adapter, progress: notifyProgressFromLedger };
}
