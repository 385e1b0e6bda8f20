/** The offline provider: a scripted research agent over a bundled corpus, with replayable simulated faults. */
export { CORPUS, CORPUS_URL_BASE, corpusDocumentUrl, type CorpusDocument } from './corpus';
export {
  DEFAULT_OFFLINE_SETTINGS,
  activeErrorWave,
  offlineSettingsSchema,
  parseOfflineSettings,
  parseOfflineSettingsJson,
  type ErrorWave,
  type OfflineSettings,
  type OfflineSettingsInput,
} from './settings';
export {
  CORPUS_TOOL_SPECS,
  READ_TOOL,
  SEARCH_TOOL,
  ToolInterruptedError,
  createCorpusToolbox,
  type CorpusToolbox,
  type CorpusToolboxOptions,
  type CorpusToolboxStats,
} from './toolbox';
export { OFFLINE_NOTE, OFFLINE_WEB_NOTE, nextAgentTurn, type AgentTurn } from './agent';
export {
  createOfflineProvider,
  estimateRequestTokens,
  estimateTokens,
  realSleep,
  type OfflineFaultKind,
  type OfflineProvider,
  type OfflineProviderOptions,
  type OfflineProviderStats,
  type Sleep,
} from './provider';
