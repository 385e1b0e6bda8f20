/**
 * The agent toolkit: every name an agent-pipeline author needs, in one place.
 *
 * - `runAgentSection(context, agent, spec)` runs one section of agent work in a step, with its
 *   recovery: warm retries on the same thread, cold retries on a clean one, then a visible skip;
 *   the provider circuit and waits; the transcript stored and validated under the job.
 * - `defineTool({ name, description, input, execute, effect? })` and `createToolbox([...])`: tools
 *   with a zod schema; one with `effect` runs through the step's effect ledger.
 * - Any model: `agent.provider` takes a ModelProvider; for an AI SDK `LanguageModel`, hand in
 *   `createAiSdkProvider({ model, ... })` from providers/ai-sdk.ts.
 * - Citations: `citeSection`, `numberCitationsAcross`, `referenceDefinitions`.
 */
export { runAgentSection, agentWait, describeDelay, overLongDelayQuestion, type AgentDeps, type AgentSectionOutcome, type ProviderWait } from './step-section';
export {
  defineTool,
  createToolbox,
  type AgentTool,
  type EffectContext,
  type EffectToolDefinition,
  type PlainToolDefinition,
  type ToolContext,
  type ToolEffect,
  type ToolOutput,
} from './define-tool';
export { toolError, toolArguments, toolParameters, ToolWaitError, type ToolCallPlace, type ToolResult, type ToolStep, type Toolbox } from './tools';
export {
  DEFAULT_SECTION_POLICY,
  EMPTY_TALLY,
  SectionAttemptError,
  resolveSectionPolicy,
  type CostTally,
  type SectionAttempts,
  type SectionOutcome,
  type SectionPolicy,
  type SectionSpec,
  type StoredTranscript,
} from './section-runner';
export { storedTranscriptSchema, parseStoredTranscript, storableTranscript } from './transcript-schema';
export {
  citeSection,
  markdownUrl,
  numberCitationsAcross,
  referenceDefinitions,
  renumberCitations,
  storableSource,
  storedSource,
  MAX_PASSAGE_CHARS,
  type CitedText,
  type Reference,
  type StoredSource,
} from './citations';
export { tracedProvider, tracedToolbox } from './traced';
export type { ChatMessage, ModelProvider, NumberedSource, Source, ToolCall, ToolSpec } from './provider';
export type { ApplyOutcome, LookupOutcome } from '../effects/port';
export { createPageFetcher, type PageFetcher, type PageFetchLimits } from './web/page-fetcher';
export { createSearxngBackend, createTavilyBackend, type SearchBackend, type SearxngOptions, type TavilyOptions } from './web/search';
export { createWebToolbox, type WebToolbox, type WebToolboxOptions } from './web/toolbox';
