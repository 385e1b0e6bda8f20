/**
 * The model provider the deployed functions use, chosen by configuration (config/environment.ts):
 * the offline simulator by default (no key, no network), or any Chat Completions-compatible endpoint.
 */
import { defineSecret } from 'firebase-functions/params';
import type { ModelProvider } from '../agent/provider';
import type { Toolbox } from '../agent/tools';
import { MODEL_API_KEY_VARIABLE, providerConfigFromEnv, type Environment } from '../config/environment';
import type { Clock } from '../core/clock';
import { createCorpusToolbox, createOfflineProvider } from '../providers/offline';
import { createOpenAiCompatibleProvider } from '../providers/openai-compatible';

/** Bound to the step function only for the keyed provider; its value reaches the function as an environment variable. */
export const modelApiKey = defineSecret(MODEL_API_KEY_VARIABLE);

export interface ConfiguredProvider {
  readonly provider: ModelProvider;
  readonly toolbox: Toolbox;
}

/** Reads configuration at call time, when a step first needs the provider. */
export function configuredProvider(clock: Clock, env: Environment = process.env): ConfiguredProvider {
  const config = providerConfigFromEnv(env);
  const { settings, seed } = config.offline;
  // The corpus tools serve both providers: they are the research sources that ship with the project.
  const toolbox = createCorpusToolbox({ settings, seed });
  if (config.kind === 'openai-compatible') return { provider: createOpenAiCompatibleProvider(config.model), toolbox };
  return { provider: createOfflineProvider({ seed, settings, clock }), toolbox };
}
