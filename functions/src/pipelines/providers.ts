/**
 * The model provider the deployed functions use, chosen by configuration: the offline simulator by
 * default (no key, no network), or any Chat Completions-compatible endpoint.
 */
import { defineSecret, defineString } from 'firebase-functions/params';
import type { ModelProvider } from '../agent/provider';
import type { Toolbox } from '../agent/tools';
import type { Clock } from '../core/clock';
import { createCorpusToolbox, createOfflineProvider, parseOfflineSettingsJson } from '../providers/offline';
import { createOpenAiCompatibleProvider, openAiCompatibleConfigSchema } from '../providers/openai-compatible';

export const providerKind = defineString('PHASELINE_PROVIDER', { default: 'offline', description: 'offline | openai-compatible' });
export const modelBaseUrl = defineString('PHASELINE_MODEL_BASE_URL', { default: 'https://api.openai.com/v1' });
export const modelName = defineString('PHASELINE_MODEL', { default: 'gpt-4o-mini' });
export const modelApiKey = defineSecret('PHASELINE_MODEL_API_KEY');

export interface ConfiguredProvider {
  readonly provider: ModelProvider;
  readonly toolbox: Toolbox;
}

/** Reads configuration at call time (params resolve only at run time, not at deploy). */
export function configuredProvider(clock: Clock, env: NodeJS.ProcessEnv = process.env): ConfiguredProvider {
  const settings = parseOfflineSettingsJson(env.PHASELINE_OFFLINE_SETTINGS);
  const seed = Number(env.PHASELINE_OFFLINE_SEED ?? '1');
  // The corpus tools serve both providers: they are the research sources that ship with the project.
  const toolbox = createCorpusToolbox({ settings, seed });
  const kind = env.PHASELINE_PROVIDER ?? providerKind.value();
  if (kind === 'openai-compatible') {
    const config = openAiCompatibleConfigSchema.parse({
      baseUrl: env.PHASELINE_MODEL_BASE_URL ?? modelBaseUrl.value(),
      model: env.PHASELINE_MODEL ?? modelName.value(),
      apiKey: env.PHASELINE_MODEL_API_KEY ?? modelApiKey.value(),
      timeoutMs: Number(env.PHASELINE_MODEL_TIMEOUT_MS ?? '120000'),
      contextWindowTokens: Number(env.PHASELINE_MODEL_CONTEXT_TOKENS ?? '128000'),
      inputUsdPer1kTokens: Number(env.PHASELINE_MODEL_INPUT_USD_PER_1K ?? '0'),
      outputUsdPer1kTokens: Number(env.PHASELINE_MODEL_OUTPUT_USD_PER_1K ?? '0'),
    });
    return { provider: createOpenAiCompatibleProvider(config), toolbox };
  }
  if (kind !== 'offline') throw new Error(`PHASELINE_PROVIDER must be offline or openai-compatible, got ${kind}`);
  return { provider: createOfflineProvider({ seed, settings, clock }), toolbox };
}
