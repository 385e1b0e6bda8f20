/**
 * The operator console's model: which jobs it lists and counts (the query shapes, declared as data
 * so a unit test checks each against firestore.indexes.json), how a job document reads as a row of
 * a list (its reason and age), and which actions apply to a job. No DOM and no Firebase imports.
 *
 * What the console reads, and what it costs (Firestore bills a read per document a query or a
 * listener delivers, and one per 1,000 index entries an aggregation counts, at least one a query):
 *   - lists of quarantined, failed and waiting jobs: live listeners on bounded queries (status ==,
 *     newest first, at most LIST_LIMIT); these documents rarely change, so a listener costs its
 *     first delivery and then a read per change;
 *   - long-running jobs: running jobs' documents change with every heartbeat (every few seconds), so
 *     a listener would cost a read per heartbeat per job; they are read (oldest first, at most
 *     LIST_LIMIT) with the counts on each refresh instead;
 *   - counts by pipeline and status: `count()` aggregations, one per pipeline and status, refreshed
 *     every REFRESH_MS and shortly after a live list changes. Completed, failed and cancelled jobs are
 *     counted over the last ENDED_WINDOW_HOURS only (by `finishedAt`), so what a refresh costs grows
 *     with recent traffic, never with the whole history.
 */
import { millisOf, readJob, type JobStatus, type JobView } from '../../client';
import { RESEARCH_PHASES } from './research-view';

export const LIST_LIMIT = 50;
export const DEFAULT_LONG_RUNNING_MINUTES = 30;
export const ENDED_WINDOW_HOURS = 24;
export const REFRESH_MS = 30_000;
/** After a live list changes, the counts are refreshed this much later (changes come in bursts). */
export const COUNTS_AFTER_CHANGE_MS = 1_500;

/** Every pipeline the functions accept, with its phases in order (test/unit/ops-model.test.ts checks it against the registry). */
export const PIPELINE_PHASES: Readonly<Record<string, readonly string[]>> = {
  canary: ['split', 'measure', 'summarize'],
  research: RESEARCH_PHASES,
  notify: ['plan', 'send'],
  triage: ['triage'],
};
export const PIPELINES = Object.keys(PIPELINE_PHASES);

/** Statuses in the order the counts table shows them. */
export const COUNTED_STATUSES: readonly JobStatus[] = ['queued', 'running', 'waiting', 'quarantined', 'failed', 'completed', 'cancelled'];
/** Statuses a job never leaves: counted over the recent window only. */
export const ENDED_STATUSES: ReadonlySet<JobStatus> = new Set(['completed', 'failed', 'cancelled']);

export type ListName = 'quarantined' | 'failed' | 'waiting' | 'long-running';
export const LIST_NAMES: readonly ListName[] = ['quarantined', 'failed', 'waiting', 'long-running'];

/** One list: jobs of one status, ordered by one field, at most LIST_LIMIT of them. */
export interface ListQueryShape {
  readonly status: JobStatus;
  readonly orderBy: 'updatedAt' | 'createdAt';
  readonly direction: 'asc' | 'desc';
  /** Live listener, or read on each refresh. */
  readonly live: boolean;
}

export const LIST_QUERIES: Readonly<Record<ListName, ListQueryShape>> = {
  quarantined: { status: 'quarantined', orderBy: 'updatedAt', direction: 'desc', live: true },
  failed: { status: 'failed', orderBy: 'updatedAt', direction: 'desc', live: true },
  waiting: { status: 'waiting', orderBy: 'updatedAt', direction: 'desc', live: true },
  // Oldest first: the jobs running longest are the ones within the limit.
  'long-running': { status: 'running', orderBy: 'createdAt', direction: 'asc', live: false },
};

/** A count: equality on pipeline and status, and for ended statuses `finishedAt >= now - window`. */
export interface CountQueryShape {
  readonly pipeline: string;
  readonly status: JobStatus;
  readonly finishedSinceMs: number | null;
}

export function countQueries(nowMs: number): CountQueryShape[] {
  const since = nowMs - ENDED_WINDOW_HOURS * 3_600_000;
  return PIPELINES.flatMap((pipeline) => COUNTED_STATUSES.map((status) => ({ pipeline, status, finishedSinceMs: ENDED_STATUSES.has(status) ? since : null })));
}

/** A job as the console reads it: the chat page's view plus what operators need. */
export interface OpsJob {
  readonly view: JobView;
  readonly owner: string;
  /** The status as stored, also one this page does not know. */
  readonly rawStatus: string;
  readonly createdAtMs: number | null;
  readonly updatedAtMs: number | null;
  readonly finishedAtMs: number | null;
  readonly quarantinedAtMs: number | null;
  readonly lastErrorAtMs: number | null;
  /** `decision`, `provider`, `budget`, …: as stored. */
  readonly waitingReason: string | null;
  readonly waitingUntilMs: number | null;
  readonly leaseExpiresAtMs: number | null;
  readonly step: number;
}

type Fields = Readonly<Record<string, unknown>>;
const fields = (value: unknown): Fields => (typeof value === 'object' && value !== null && !Array.isArray(value) ? (value as Fields) : {});
const text = (value: unknown): string | null => (typeof value === 'string' ? value : null);

export function readOpsJob(id: string, data: unknown): OpsJob {
  const doc = fields(data);
  const step = doc.step;
  return {
    view: readJob(id, data),
    owner: text(doc.owner) ?? '?',
    rawStatus: text(doc.status) ?? '?',
    createdAtMs: millisOf(doc.createdAt),
    updatedAtMs: millisOf(doc.updatedAt),
    finishedAtMs: millisOf(doc.finishedAt),
    quarantinedAtMs: millisOf(fields(doc.quarantine).at),
    lastErrorAtMs: millisOf(fields(doc.lastError).at),
    waitingReason: doc.waiting ? (text(fields(doc.waiting).reason) ?? '?') : null,
    waitingUntilMs: millisOf(fields(doc.waiting).until),
    leaseExpiresAtMs: millisOf(fields(doc.lease).expiresAt),
    step: typeof step === 'number' && Number.isFinite(step) ? step : 0,
  };
}

/** "45 s", "12 min", "3 h 5 min", "2 d 4 h". */
export function formatAge(ms: number): string {
  const seconds = Math.max(0, Math.floor(ms / 1000));
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 24) return minutes % 60 === 0 ? `${hours} h` : `${hours} h ${minutes % 60} min`;
  const days = Math.floor(hours / 24);
  return hours % 24 === 0 ? `${days} d` : `${days} d ${hours % 24} h`;
}

export interface ListEntry {
  readonly job: OpsJob;
  /** Why the job is on this list, in words. */
  readonly reason: string;
  /** Since when that is so (null when the document does not say). */
  readonly sinceMs: number | null;
}

function waitingReason(job: OpsJob): string {
  const wait = job.view.waiting;
  const question = wait?.question ? `: ${wait.question}` : '';
  switch (job.waitingReason) {
    case 'decision':
      return `for its owner's decision${question}`;
    case 'provider':
      return `for a provider to recover${job.waitingUntilMs === null ? '' : ` (resumes at ${new Date(job.waitingUntilMs).toISOString()})`}`;
    default:
      return `${job.waitingReason ?? 'unknown reason'}${question}`;
  }
}

/** A job's row on a list: the reason it is there and since when. */
export function listEntry(list: ListName, job: OpsJob): ListEntry {
  switch (list) {
    case 'quarantined':
      return { job, reason: job.view.quarantine?.reason ?? 'no reason recorded', sinceMs: job.quarantinedAtMs ?? job.updatedAtMs };
    case 'failed':
      return { job, reason: job.view.lastError ? `${job.view.lastError.code}: ${job.view.lastError.message}` : 'no error recorded', sinceMs: job.finishedAtMs ?? job.lastErrorAtMs ?? job.updatedAtMs };
    case 'waiting':
      return { job, reason: waitingReason(job), sinceMs: job.updatedAtMs };
    case 'long-running': {
      const budget = `attempts ${job.view.attempts}, lost workers ${job.view.staleReclaims}`;
      const where = job.view.fanout ? `${job.view.fanout.phase}: ${job.view.fanout.done}/${job.view.fanout.units} units` : (job.view.phase ?? 'first step');
      return { job, reason: `${where} (${budget})`, sinceMs: job.createdAtMs };
    }
  }
}

/** The long-running list: running jobs submitted more than `minutes` ago, oldest first. */
export function longRunning(jobs: readonly OpsJob[], minutes: number, nowMs: number): OpsJob[] {
  return jobs.filter((job) => job.createdAtMs !== null && nowMs - job.createdAtMs > minutes * 60_000).sort((a, b) => (a.createdAtMs ?? 0) - (b.createdAtMs ?? 0));
}

export type OpsActionName = 'release' | 'cancel' | 'redrive';

/** The statuses each action applies to (the endpoint decides again from the job as it stands). */
export const ACTION_STATUSES: Readonly<Record<OpsActionName, ReadonlySet<string>>> = {
  release: new Set(['quarantined']),
  cancel: new Set(['queued', 'running', 'waiting']),
  redrive: new Set(['completed', 'failed', 'quarantined']),
};

export function actionsFor(status: string): ReadonlySet<OpsActionName> {
  return new Set((Object.keys(ACTION_STATUSES) as OpsActionName[]).filter((action) => ACTION_STATUSES[action].has(status)));
}

/** The phases a job of this pipeline may be re-driven from; empty for a pipeline this page does not know. */
export function phasesOf(pipeline: string): readonly string[] {
  return Object.hasOwn(PIPELINE_PHASES, pipeline) ? (PIPELINE_PHASES[pipeline] ?? []) : [];
}

/** A count cell: the number, or why there is none. */
export type CountCell = { readonly kind: 'count'; readonly value: number } | { readonly kind: 'error'; readonly message: string };

/** Counts by pipeline, then status; `all` sums the pipelines. */
export function countTable(counts: ReadonlyMap<string, CountCell>): { rows: { pipeline: string; cells: (CountCell | null)[] }[] } {
  const rows = PIPELINES.map((pipeline) => ({ pipeline, cells: COUNTED_STATUSES.map((status) => counts.get(countKey(pipeline, status)) ?? null) }));
  const totals = COUNTED_STATUSES.map((_status, index): CountCell | null => {
    let sum = 0;
    for (const row of rows) {
      const cell = row.cells[index];
      if (!cell) return null;
      if (cell.kind === 'error') return cell;
      sum += cell.value;
    }
    return { kind: 'count', value: sum };
  });
  return { rows: [...rows, { pipeline: 'all', cells: totals }] };
}

export function countKey(pipeline: string, status: string): string {
  return `${pipeline}/${status}`;
}
