/**
 * The agent toolkit's public face: what an agent pipeline's author needs (the model and tool
 * ports, the section runner that checkpoints a tool-calling transcript, transcript helpers, the
 * web tools, tracing wrappers). The public API (api/index.ts) re-exports it.
 */
export {
  ContextWindowError,
  MalformedResponseError,
  ProviderRateLimitedError,
  ProviderRequestError,
  ProviderTimeoutError,
  ProviderUnavailableError,
  isProviderOutage,
  providerErrorForStatus,
  type BilledCall,
  type ChatMessage,
  type ChatRequest,
  type ChatResponse,
  type ModelProvider,
  type NumberedSource,
  type Source,
  type ToolCall,
  type ToolSpec,
  type Usage,
} from './provider';
export {
  DEFAULT_SECTION_POLICY,
  resolveSectionPolicy,
  runSection,
  type CostTally,
  type SectionDeps,
  type SectionOutcome,
  type SectionPolicy,
  type SectionSpec,
  type StoredTranscript,
  type TranscriptPort,
  type UsageEntry,
} from './section-runner';
export { toolArguments, toolError, toolParameters, type ToolResult, type Toolbox } from './tools';
export { findProblems, repairForWarmRetry, sourceKey, titleForText, type TranscriptProblem } from './transcript';
export { tracedProvider, tracedToolbox } from './traced';
export { createPageFetcher, type PageFetcher, type PageFetchLimits } from './web/page-fetcher';
export { createSearxngBackend, createTavilyBackend, type SearchBackend, type SearxngOptions, type TavilyOptions } from './web/search';
export { createWebToolbox, type WebToolbox, type WebToolboxOptions } from './web/toolbox';
