/**
 * The model provider and research tools the deployed functions use, chosen by configuration
 * (config/environment.ts): the offline simulator by default (no key, no network), or any Chat
 * Completions-compatible endpoint; the bundled corpus tools by default, or web search (SearXNG or
 * Tavily) with fetch_page. Both come wrapped for tracing (agent/traced.ts): every model call and
 * every tool call is a span of the step that made it (no-op spans unless an exporter is configured).
 */
import { createCorpusToolbox, createOfflineProvider, createOpenAiCompatibleProvider, createPageFetcher, createSearxngBackend, createTavilyBackend, createWebToolbox, providerConfigFromEnv, toolsConfigFromEnv, tracedProvider, tracedToolbox, type ArtifactStore, type Clock, type Environment, type ModelProvider, type SearchBackend, type SearchConfig, type Toolbox } from '../api';

export interface ConfiguredProvider {
  readonly provider: ModelProvider;
  readonly toolbox: Toolbox;
}

export interface ConfiguredProviderOptions {
  /** Where fetch_page keeps the full text of the pages it reads, under the job (the deployed functions: Firestore). */
  readonly artifacts: ArtifactStore;
}

function searchBackendFor(search: Exclude<SearchConfig, { kind: 'corpus' }>): SearchBackend {
  return search.kind === 'searxng' ? createSearxngBackend(search) : createTavilyBackend(search);
}

/** Reads configuration at call time, when a step first needs the provider; provider and tools come traced. */
export function configuredProvider(clock: Clock, env: Environment, options: ConfiguredProviderOptions): ConfiguredProvider {
  const { provider, toolbox } = untracedProvider(clock, env, options);
  return { provider: tracedProvider(provider), toolbox: tracedToolbox(toolbox) };
}

function untracedProvider(clock: Clock, env: Environment, options: ConfiguredProviderOptions): ConfiguredProvider {
  const config = providerConfigFromEnv(env);
  const tools = toolsConfigFromEnv(env);
  const { settings, seed } = config.offline;
  // Either toolbox serves both providers: the corpus ships with the project; the web needs a backend.
  const toolbox =
    'pages' in tools
      ? createWebToolbox({
          search: searchBackendFor(tools.search),
          pages: createPageFetcher(tools.pages),
          artifacts: options.artifacts,
          clock,
          pageTokenBudget: tools.pages.tokenBudget,
          artifactBytesPerJob: tools.pages.artifactBytesPerJob,
        })
      : createCorpusToolbox({ settings, seed });
  if (config.kind === 'openai-compatible') return { provider: createOpenAiCompatibleProvider(config.model), toolbox };
  return { provider: createOfflineProvider({ seed, settings, clock }), toolbox };
}
