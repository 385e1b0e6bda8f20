/**
 * Phaseline's client for frontends (`phaseline/client`): submit a job with an idempotency key and
 * retries that reuse it, watch it through Firestore as typed snapshots, answer its questions,
 * cancel it. It depends on the Firebase web SDK only. The contract it speaks: docs/frontend.md.
 */
export { createPhaselineClient, type PhaselineClient, type PhaselineClientOptions } from './client';
export { connectFirebase, idTokenOf, signedInUser, type EmulatorAddresses, type FirebaseConnection } from './connect';
export {
  createPhaselineApi,
  newIdempotencyKey,
  PhaselineApiError,
  type AnswerAnswer,
  type CallOptions,
  type CancelAnswer,
  type FetchLike,
  type FetchResponseLike,
  type PhaselineApi,
  type PhaselineApiOptions,
  type SubmitAnswer,
  type SubmitRequest,
} from './http';
export {
  ACTIVE_STATUSES,
  describeStatus,
  draftsInFlight,
  formatCost,
  formatUsd,
  JOB_STATUSES,
  millisOf,
  outboxPath,
  questionOf,
  readDraft,
  readEffect,
  readEvent,
  readJob,
  readResult,
  readSection,
  readUnit,
  sectionKeyOf,
  TERMINAL_STATUSES,
  type DraftView,
  type EffectView,
  type EventView,
  type JobQuestion,
  type JobStatus,
  type JobView,
  type JobWaitView,
  type ResultView,
  type SectionView,
  type SourceView,
  type StoppedEffectsView,
  type UnitView,
  type WaitReason,
} from './job-model';
export { DEFAULT_RETRY_POLICY, isRetryable, parseRetryAfter, QUOTA_EXCEEDED, retryDelayMs, systemRetryClock, type FailedTry, type RetryClock, type RetryPolicy } from './retry';
export { deriveSnapshot, emptySnapshot, waitForJob, WATCHED_PARTS, watchJob, type JobSnapshot, type WaitForJobOptions, type WatchedPart, type WatchError, type WatchOptions } from './watch';
