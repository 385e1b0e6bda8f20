/**
 * Phaseline's public API: everything a pipeline author imports, as the package `phaseline`
 * (`import { definePipeline, definePhase, createPhaseline } from 'phaseline'`). Inside this
 * repository pipelines import it as '../api'; nothing else of functions/src is public, and lint
 * keeps pipelines/ and examples/ to it. Every export here is documented where it is declared.
 */

// Defining pipelines and phases, and the step context a phase runs with.
export {
  DEFAULT_PIPELINE_ACCESS,
  PIPELINE_GRANTS_CLAIM,
  defineFanOutPhase,
  definePhase,
  definePipeline,
  pipelineRegistry,
  type DecisionWait,
  type FanOut,
  type OlderVersionReading,
  type PhaseDefinition,
  type PhaseMigration,
  type PhaseOutcome,
  type PhaseRefusal,
  type PipelineAccess,
  type PipelineDefinition,
  type PipelineRegistry,
  type ProviderWait,
  type PublishedResult,
  type SectionRecord,
  type SpendMeter,
  type StepContext,
  type StepLimits,
  type UnitOutcome,
} from '../core/pipeline';
export { systemClock, type Clock, type RandomSource } from '../core/clock';
export type { Timers } from '../core/flusher';
export { capServerDelay, type CappedDelay } from '../core/server-delay';

// Errors a phase throws: retry intent is in the error's type, never in its message.
export {
  CorruptCheckpointError,
  OwnershipLostError,
  PhaselineError,
  RetryAfterError,
  RetryableError,
  SpendLimitReachedError,
  TerminalError,
  describeError,
  type ErrorCode,
  type PhaselineErrorOptions,
} from '../core/errors';

// External effects: the ledger, keys, the adapter port and the settle protocol.
export { deriveEffectKey } from '../core/effect-keys';
export {
  EFFECT_STATES,
  EffectIntentConflictError,
  UNRESOLVED_EFFECT_STATES,
  effectKeySchema,
  type EffectEntry,
  type EffectEvidence,
  type EffectIntent,
  type EffectLedger,
  type EffectState,
} from '../effects/ledger';
export type { ApplyOutcome, EffectAdapter, LookupOutcome } from '../effects/port';
export { settleEffect, type SettleOptions, type SettleResult } from '../effects/protocol';
export type { UnknownAnswer } from '../effects/reconcile';
export { createHttpEffectAdapter, type HttpEffectAdapterOptions } from '../effects/http-adapter';
export type { StoppedEffectsDeps, StoppedEffectsSettler } from '../engine/settle-stopped';

// The agent toolkit (agent/index.ts) and the provider circuit a model pipeline waits on.
export * from '../agent';
export type { CircuitState, ProviderCircuit } from '../core/circuit';
export { firestoreCircuit } from '../store/provider-circuit';
export { firestoreArtifactStore, type ArtifactRef, type ArtifactStore } from '../store/artifact-store';

// Model providers and tool backends.
export { createAiSdkProvider, type AiSdkLanguageModel, type AiSdkProviderOptions } from '../providers/ai-sdk';
export { createOpenAiCompatibleProvider, type OpenAiCompatibleConfig } from '../providers/openai-compatible';
export { createCorpusToolbox, createOfflineProvider } from '../providers/offline';

// Configuration read from the environment (every variable is declared in config/environment.ts).
export {
  ConfigurationError,
  RECEIVER_URL_VARIABLE,
  providerConfigFromEnv,
  receiverConfigFromEnv,
  sectionPolicyFromEnv,
  toolsConfigFromEnv,
  type Environment,
  type ProviderConfig,
  type ReceiverConfig,
  type SearchConfig,
  type ToolsConfig,
} from '../config/environment';

// The deployed functions.
export { createPhaseline, type PhaselineFunctions, type PhaselineOptions } from './create-phaseline';
export { phaselineFirestore } from './backends';
