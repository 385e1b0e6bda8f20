/**
 * A span per Firestore commit of the engine (`commit <kind>`): what it was (claim, heartbeat,
 * transcript, section, hand-off, ...), how it ended, and how many times its update-time
 * precondition failed before it did. The store calls in at its commit points: `traceCommit` around
 * a write (its retries and re-reads included), `noteJobCommit` / `noteUnitCommit` where it adds a
 * job or unit record to the commit, `noteCommitPreconditionFailed` where a conditioned commit is
 * refused. A commit traced inside another (a claim-slot write retried by the store) is part of it.
 *
 * Once a commit that gave this step its claim has landed, the step learns its epoch and phase
 * from the record (scope.ts), so every later log line and span carries them.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { SpanKind, type Span } from '@opentelemetry/api';
import { annotateStep, currentStep, type StepFields } from './scope';
import { errorOutcome, OUTCOME_ATTRIBUTE, safely, startChildSpan, withSpan } from './spans';

export const COMMIT_ATTRIBUTES = {
  system: 'db.system.name',
  kind: 'phaseline.commit.kind',
  label: 'phaseline.commit.label',
  preconditionFailures: 'phaseline.commit.precondition_failures',
} as const;

/** What a commit note needs of a job record. */
export interface CommittedJob {
  readonly id: string;
  readonly status: string;
  readonly epoch: number;
  readonly phase: string | null;
}

/** What a commit note needs of a unit record. */
export interface CommittedUnit {
  readonly jobId: string;
  readonly unit: string;
  readonly phase: string;
  readonly status: string;
  readonly epoch: number;
}

interface CommitTrace {
  readonly span: Span;
  /** The last attempt's records: a retried transaction adds them again. */
  job?: { readonly kind: string; readonly next: CommittedJob };
  unit?: { readonly kind: string; readonly next: CommittedUnit };
  preconditionFailures: number;
}

const commits = new AsyncLocalStorage<CommitTrace>();

/** The kind of a job commit, from the records and the events it writes. */
export function jobCommitKind(current: Pick<CommittedJob, 'status' | 'epoch'>, next: Pick<CommittedJob, 'status' | 'epoch'>, events: readonly { readonly kind: string }[]): string {
  const eventKinds = new Set(events.map((event) => event.kind));
  if (next.status === 'running' && (current.status !== 'running' || current.epoch !== next.epoch)) return eventKinds.has('reclaimed') ? 'take-over' : 'claim';
  if (current.status === 'running' && next.status === 'queued') {
    if (eventKinds.has('retrying')) return 'retry';
    if (eventKinds.has('reclaimed')) return 'reclaim';
    return 'hand-off';
  }
  if (current.status !== next.status) return next.status;
  return events[0]?.kind ?? 'heartbeat';
}

/** The kind of a unit commit: `unit-claim`, `unit-heartbeat`, or `unit-<new status>`. */
export function unitCommitKind(current: Pick<CommittedUnit, 'status' | 'epoch'>, next: Pick<CommittedUnit, 'status' | 'epoch'>): string {
  if (next.status === 'running' && (current.status !== 'running' || current.epoch !== next.epoch)) return 'unit-claim';
  if (current.status === next.status) return 'unit-heartbeat';
  return `unit-${next.status}`;
}

/** A label's first word (`transcript s1 for job j` is a transcript commit); the records' kind wins. */
function labelKind(label: string): string {
  return /^[a-z-]+/.exec(label)?.[0] ?? 'write';
}

function commitKind(trace: CommitTrace, label: string): string {
  if (trace.job && trace.job.kind !== 'heartbeat') return trace.job.kind;
  return trace.unit?.kind ?? trace.job?.kind ?? labelKind(label);
}

/** An ALREADY_EXISTS from a `create` (gRPC code 6): the document was there, nothing landed. */
function commitOutcome(error: unknown): string {
  if (error !== null && typeof error === 'object' && (error as { code?: unknown }).code === 6) return 'already-exists';
  return errorOutcome(error);
}

/** What the step learns from a commit that landed: the epoch and phase of the claim it holds. */
function learnt(trace: CommitTrace): StepFields | null {
  const fields = currentStep()?.fields;
  if (!fields) return null;
  if (fields.unit === undefined) {
    const job = trace.job?.next;
    if (job === undefined || job.id !== fields.jobId || job.status !== 'running') return null;
    return { epoch: job.epoch, ...(fields.phase === undefined && job.phase !== null ? { phase: job.phase } : {}) };
  }
  const unit = trace.unit?.next;
  if (unit === undefined || unit.jobId !== fields.jobId || unit.unit !== fields.unit || unit.status !== 'running') return null;
  return { epoch: unit.epoch, phase: unit.phase };
}

/** One commit (with its retries) as a span; `label` names what is written (`job j1`, `transcript s1 for unit j1/u`). */
export function traceCommit<T>(label: string, write: () => Promise<T>): Promise<T> {
  if (commits.getStore()) return write();
  const span = startChildSpan('commit', { kind: SpanKind.CLIENT, attributes: { [COMMIT_ATTRIBUTES.system]: 'firestore', [COMMIT_ATTRIBUTES.label]: label } });
  const trace: CommitTrace = { span, preconditionFailures: 0 };
  const finish = (recording: Span) => {
    const kind = commitKind(trace, label);
    recording.updateName(`commit ${kind}`);
    recording.setAttributes({ [COMMIT_ATTRIBUTES.kind]: kind, [COMMIT_ATTRIBUTES.preconditionFailures]: trace.preconditionFailures });
  };
  return withSpan(span, () => commits.run(trace, write), {
    onResult: (recording) => {
      const fields = learnt(trace);
      if (fields) annotateStep(fields);
      finish(recording);
    },
    onError: (recording, error) => {
      finish(recording);
      recording.setAttribute(OUTCOME_ATTRIBUTE, commitOutcome(error));
    },
  });
}

/** The commit in progress writes this job record (called for each attempt; the last one counts). */
export function noteJobCommit(current: CommittedJob, next: CommittedJob, events: readonly { readonly kind: string }[]): void {
  const trace = commits.getStore();
  if (trace) safely(() => (trace.job = { kind: jobCommitKind(current, next, events), next }));
}

/** The commit in progress writes this unit record. */
export function noteUnitCommit(current: CommittedUnit, next: CommittedUnit): void {
  const trace = commits.getStore();
  if (trace) safely(() => (trace.unit = { kind: unitCommitKind(current, next), next }));
}

/** The commit in progress was refused by its update-time precondition (it reads and tries again, or gives up). */
export function noteCommitPreconditionFailed(): void {
  const trace = commits.getStore();
  if (trace) trace.preconditionFailures += 1;
}
