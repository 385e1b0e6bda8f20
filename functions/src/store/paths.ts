/** Every Firestore path the engine uses, in one place. */
export const JOBS = 'jobs';
export const jobPath = (jobId: string): string => `${JOBS}/${jobId}`;
export const unitsPath = (jobId: string): string => `${JOBS}/${jobId}/units`;
/** Units are keyed by phase and unit ID, so two fan-out phases with the same unit IDs never share a document. */
export const unitPath = (jobId: string, phase: string, unit: string): string => `${JOBS}/${jobId}/units/${phase}~${unit}`;
export const checkpointPath = (jobId: string, phase: string): string => `${JOBS}/${jobId}/checkpoints/${phase}`;
export const sectionPath = (jobId: string, sectionKey: string): string => `${JOBS}/${jobId}/sections/${sectionKey}`;
export const transcriptPath = (jobId: string, sectionKeyValue: string): string => `${JOBS}/${jobId}/transcripts/${sectionKeyValue}`;
/** The text of a section in flight as its model writes it: a view for the owner, never state. */
export const draftPath = (jobId: string, sectionKeyValue: string): string => `${JOBS}/${jobId}/drafts/${sectionKeyValue}`;
/**
 * Who holds a job's or unit's claim right now: one small document per holder slot ("job", or the
 * unit's `{phase}~{unit}`), written only when the claim changes hands. The holder's own writes are
 * conditioned on its update time, so the hot job document is not rewritten on every save.
 */
export const JOB_CLAIM_SLOT = 'job';
export const unitClaimSlot = (phase: string, unit: string): string => `${phase}~${unit}`;
export const claimPath = (jobId: string, slot: string): string => `${JOBS}/${jobId}/claims/${slot}`;
export const circuitPath = (name: string): string => `circuits/${name}`;
/** The effect ledger: one entry per external effect, keyed by its idempotency key. */
export const effectsPath = (jobId: string): string => `${JOBS}/${jobId}/effects`;
export const effectPath = (jobId: string, effectKey: string): string => `${JOBS}/${jobId}/effects/${effectKey}`;
/**
 * Artifacts (store/artifact-store.ts): a manifest per content hash, and its bytes in chunk
 * documents beside it. Two collection groups, `artifacts` and `artifactChunks`, directly under the job.
 */
export const ARTIFACTS = 'artifacts';
export const ARTIFACT_CHUNKS = 'artifactChunks';
export const artifactPath = (jobId: string, sha256: string): string => `${JOBS}/${jobId}/${ARTIFACTS}/${sha256}`;
export const artifactChunkPath = (jobId: string, sha256: string, index: number): string => `${JOBS}/${jobId}/${ARTIFACT_CHUNKS}/${sha256}~${String(index).padStart(6, '0')}`;
export const eventPath = (jobId: string, eventId: string): string => `${JOBS}/${jobId}/events/${eventId}`;
/** The ID of a job's `seq`-th timeline event: zero-padded, so the events sort in the order they were numbered. */
export const eventId = (seq: number): string => `j${String(seq).padStart(8, '0')}`;
export const resultPath = (jobId: string): string => `${JOBS}/${jobId}/results/final`;
export const conversationPath = (conversationId: string): string => `conversations/${conversationId}`;
export const messagePath = (conversationId: string, jobId: string): string => `conversations/${conversationId}/messages/${jobId}`;
/** Task payloads that could not be understood: recorded for a person, acknowledged to Cloud Tasks. */
export const REJECTED_TASKS = 'rejectedTasks';

/** Section documents are keyed by phase, unit and the pipeline's own ID, so IDs never collide across them. */
export function sectionKey(phase: string, unit: string | null, id: string): string {
  return [phase, unit ?? '-', id].map((part) => part.replace(/[/]/g, '_')).join('~');
}

/** What every section key of one phase and unit starts with: one range of document IDs holds them all. */
export function sectionKeyPrefix(phase: string, unit: string | null): string {
  return sectionKey(phase, unit, '');
}
/** Per-user limits an operator set (`core/quota.ts`); no client writes it. */
export const USER_LIMITS = 'userLimits';
export const userLimitsPath = (uid: string): string => `${USER_LIMITS}/${uid}`;
/** What counts against a user's limits: written only in the transaction that creates one of their jobs. */
export const QUOTA_USAGE = 'quotaUsage';
export const quotaUsagePath = (uid: string): string => `${QUOTA_USAGE}/${uid}`;

/** Counts across users (core/quota.ts): the ceiling on anonymous jobs in flight. Functions only; no client reads them. */
export const QUOTA_TOTALS = 'quotaTotals';
export const ANONYMOUS_TOTAL_PATH = `${QUOTA_TOTALS}/anonymous`;
/** One user's model spend on one UTC day (`YYYY-MM-DD`): charged by the steps, read before each model call. */
export const SPEND_DAYS = 'spendDays';
export const spendDayPath = (uid: string, day: string): string => `${QUOTA_USAGE}/${uid}/${SPEND_DAYS}/${day}`;
/** One write of a step's charges, beside the day it counted against: its document ID is the charge's identity, so a repeat is recognised. */
export const SPEND_CHARGES = 'spendCharges';
export const spendChargePath = (uid: string, day: string, chargeId: string): string => `${spendDayPath(uid, day)}/${SPEND_CHARGES}/${chargeId}`;
