/**
 * A job as a reader sees it: the fields the engine writes (functions/src/store/codec.ts), decoded
 * defensively from whatever a Firestore client hands over (the web SDK, the admin SDK, plain
 * objects), and a few summaries every frontend shows. No DOM and no Firebase imports: the chat page,
 * `npm run demo` and the CLI share it, and a decoder never throws on a document it does not expect.
 */
import { cancellationReport, type StoppedEffectsView } from '../functions/src/effects/stop-report';

export type { StoppedEffectsView } from '../functions/src/effects/stop-report';

/** Every status a job document can hold (see the lifecycle in docs/frontend.md). */
export const JOB_STATUSES = ['queued', 'running', 'waiting', 'completed', 'failed', 'cancelled', 'quarantined'] as const;

/** A job's lifecycle state. */
export type JobStatus = (typeof JOB_STATUSES)[number];

/** Statuses a job can still leave by itself or through its owner. */
export const ACTIVE_STATUSES: ReadonlySet<string> = new Set(['queued', 'running', 'waiting']);

/** Statuses a job never leaves by itself (an operator may release a quarantined job). */
export const TERMINAL_STATUSES: ReadonlySet<string> = new Set(['completed', 'failed', 'cancelled', 'quarantined']);

/** Why a job waits: for its owner's decision, for a model provider to recover, or at the owner's daily spend limit. */
export type WaitReason = 'decision' | 'provider' | 'budget';

/** The job's `waiting` field: what it waits for and, for a person, the question and its options. */
export interface JobWaitView {
  readonly reason: WaitReason;
  readonly questionId: string;
  readonly question: string;
  readonly options: readonly string[];
  /** When the job resumes by itself (a provider wait, the spend limit's reset); null when only an answer resumes it. */
  readonly untilMs: number | null;
}

/** The job document (`jobs/{jobId}`), decoded. */
export interface JobView {
  readonly id: string;
  /** `unknown` if the document holds a status this client does not know. */
  readonly status: JobStatus | 'unknown';
  readonly outcome: 'complete' | 'partial' | null;
  readonly pipeline: string;
  readonly phase: string | null;
  /** The input's `question`, when the input has one (the research pipeline's does). */
  readonly question: string | null;
  readonly conversationId: string | null;
  readonly attempts: number;
  readonly staleReclaims: number;
  /** The fencing epoch of the job's latest claim. */
  readonly epoch: number;
  /** The job's step: every requeue (a wait resumed, a decision given) moves it on. */
  readonly step: number;
  readonly progress: Readonly<Record<string, number>>;
  readonly cost: Readonly<Record<string, number>>;
  readonly fanout: { readonly phase: string; readonly units: number; readonly done: number } | null;
  readonly waiting: JobWaitView | null;
  readonly lastError: { readonly code: string; readonly message: string; readonly retryable: boolean } | null;
  readonly quarantine: { readonly reason: string } | null;
  /** `report` is rendered here from the structured fields the engine stores (never stored as words). */
  readonly cancellation: { readonly reason: string; readonly report: string; readonly effects: StoppedEffectsView | null } | null;
  /** The owner's answers so far, by question ID. */
  readonly decisions: Readonly<Record<string, string>>;
  readonly createdAtMs: number | null;
  readonly finishedAtMs: number | null;
}

/** A fan-out unit (`jobs/{jobId}/units/{unitId}`), for example one research expert. */
export interface UnitView {
  readonly unit: string;
  readonly status: string;
  /** The fencing epoch of the unit's latest claim. */
  readonly epoch: number;
  readonly progress: Readonly<Record<string, number>>;
}

/** One entry of the job's timeline (`jobs/{jobId}/events/{seq}`). */
export interface EventView {
  readonly id: string;
  /** `submitted`, `claimed`, `checkpointed`, `retried`, `waiting`, `decided`, `completed`, ... */
  readonly kind: string;
  readonly message: string;
  readonly unit: string | null;
  readonly atMs: number;
}

/** An entry of the job's effect ledger (`jobs/{jobId}/effects/{key}`). */
export interface EffectView {
  readonly id: string;
  /** `planned | applying | applied | unknown | failed`. */
  readonly state: string;
  /** What the effect was meant to do, when the ledger entry says. */
  readonly intent: string | null;
}

/** A finished job's published answer (the outbox document, see {@link outboxPath}). */
export interface ResultView {
  readonly title: string;
  readonly markdown: string;
  readonly outcome: 'complete' | 'partial' | null;
  /** The parts a partial answer lacks, named for people. */
  readonly missing: readonly string[];
}

/** A recorded section (`jobs/{jobId}/sections/{key}`): the checkpoint grain, as much of it as a live view shows. */
export interface SectionView {
  readonly phase: string;
  readonly unit: string | null;
  readonly id: string;
  /** The order sections were recorded in, within their phase. */
  readonly seq: number;
  /** The section's heading and text, when it has them (a research report section does). */
  readonly heading: string | null;
  readonly text: string | null;
  readonly missing: boolean;
  /** What the section's `[k]` markers cite: `sources[k-1]`. */
  readonly sources: readonly SourceView[];
}

/** One cited source of a section. */
export interface SourceView {
  readonly number: number;
  readonly title: string;
  readonly url: string;
}

/** The text of a section in flight (`jobs/{jobId}/drafts/{key}`), as the model writes it; a retry overwrites it. */
export interface DraftView {
  readonly phase: string;
  readonly unit: string | null;
  readonly id: string;
  readonly text: string;
  /** The claim epoch of the worker writing it. */
  readonly epoch: number;
  readonly updatedAtMs: number;
}

/** A question the job waits on its owner to answer ({@link JobWaitView} for a person, never a provider wait). */
export interface JobQuestion {
  readonly jobId: string;
  readonly questionId: string;
  readonly question: string;
  readonly options: readonly string[];
  /** `decision`: the pipeline asks; `budget`: paused at the daily spend limit (options `resume`, `cancel`). */
  readonly reason: Exclude<WaitReason, 'provider'>;
  /** The job's step when asked: a job asking the same question again after a resume asks it at a later step. */
  readonly step: number;
  /** When the job resumes by itself without an answer, if it does. */
  readonly untilMs: number | null;
}

type Fields = Readonly<Record<string, unknown>>;

function fields(value: unknown): Fields {
  return typeof value === 'object' && value !== null && !Array.isArray(value) ? (value as Fields) : {};
}

function text(value: unknown): string | null {
  return typeof value === 'string' ? value : null;
}

function count(value: unknown): number {
  return typeof value === 'number' && Number.isFinite(value) ? value : 0;
}

function counts(value: unknown): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [key, entry] of Object.entries(fields(value))) if (typeof entry === 'number' && Number.isFinite(entry)) out[key] = entry;
  return out;
}

function strings(value: unknown): string[] {
  return Array.isArray(value) ? value.filter((entry): entry is string => typeof entry === 'string') : [];
}

/** Epoch milliseconds from a Firestore Timestamp (either SDK), a number, or nothing. */
export function millisOf(value: unknown): number | null {
  if (typeof value === 'number' && Number.isFinite(value)) return value;
  const toMillis = fields(value).toMillis;
  if (typeof toMillis === 'function') {
    const ms: unknown = (toMillis as () => unknown).call(value);
    return typeof ms === 'number' ? ms : null;
  }
  return null;
}

function statusOf(value: unknown): JobStatus | 'unknown' {
  return (JOB_STATUSES as readonly unknown[]).includes(value) ? (value as JobStatus) : 'unknown';
}

function outcomeOf(value: unknown): 'complete' | 'partial' | null {
  return value === 'complete' || value === 'partial' ? value : null;
}

/** Decodes a job document's data; fields it cannot read get neutral values (`unknown`, 0, null). */
export function readJob(id: string, data: unknown): JobView {
  const doc = fields(data);
  const fanout = fields(doc.fanout);
  const waiting = fields(doc.waiting);
  const lastError = fields(doc.lastError);
  const quarantine = fields(doc.quarantine);
  const cancellation = fields(doc.cancellation);
  const decisions: Record<string, string> = {};
  for (const [key, answer] of Object.entries(fields(doc.decisions))) if (typeof answer === 'string') decisions[key] = answer;
  return {
    id,
    status: statusOf(doc.status),
    outcome: outcomeOf(doc.outcome),
    pipeline: text(doc.pipeline) ?? '?',
    phase: text(doc.phase),
    question: text(fields(doc.input).question),
    conversationId: text(doc.conversationId),
    attempts: count(doc.attempts),
    staleReclaims: count(doc.staleReclaims),
    epoch: count(doc.epoch),
    step: count(doc.step),
    progress: counts(doc.progress),
    cost: counts(doc.cost),
    fanout: doc.fanout ? { phase: text(fanout.phase) ?? '?', units: count(fanout.units), done: count(fanout.done) } : null,
    waiting: doc.waiting
      ? {
          reason: waiting.reason === 'provider' || waiting.reason === 'budget' ? waiting.reason : 'decision',
          questionId: text(waiting.questionId) ?? '',
          question: text(waiting.question) ?? '',
          options: strings(waiting.options),
          untilMs: millisOf(waiting.until),
        }
      : null,
    lastError: doc.lastError ? { code: text(lastError.code) ?? 'unknown', message: text(lastError.message) ?? '', retryable: lastError.retryable === true } : null,
    quarantine: doc.quarantine ? { reason: text(quarantine.reason) ?? 'no reason recorded' } : null,
    cancellation: doc.cancellation ? readCancellation(cancellation) : null,
    decisions,
    createdAtMs: millisOf(doc.createdAt),
    finishedAtMs: millisOf(doc.finishedAt),
  };
}

function readStoppedEffects(value: unknown): StoppedEffectsView | null {
  const effects = fields(value);
  if (!value || typeof effects.settled !== 'boolean') return null;
  const tally = fields(effects.counts);
  return {
    counts: { planned: count(tally.planned), applying: count(tally.applying), applied: count(tally.applied), unknown: count(tally.unknown), failed: count(tally.failed) },
    settled: effects.settled,
    checkedWith: text(effects.checkedWith),
  };
}

function readCancellation(doc: Fields): NonNullable<JobView['cancellation']> {
  const reason = text(doc.reason) ?? '';
  const effects = readStoppedEffects(doc.effects);
  const sectionsDone = typeof doc.sectionsDone === 'number' ? doc.sectionsDone : null;
  return { reason, effects, report: cancellationReport({ reason, by: text(doc.by), phase: text(doc.phase), sectionsDone, effects }) };
}

/** The question a job waits on its owner to answer, or null (not waiting, or waiting for a provider). */
export function questionOf(job: JobView): JobQuestion | null {
  const { waiting } = job;
  if (job.status !== 'waiting' || waiting === null || waiting.reason === 'provider') return null;
  return { jobId: job.id, questionId: waiting.questionId, question: waiting.question, options: waiting.options, reason: waiting.reason, step: job.step, untilMs: waiting.untilMs };
}

/** Decodes a fan-out unit document; `id` names it when the document does not. */
export function readUnit(id: string, data: unknown): UnitView {
  const doc = fields(data);
  return { unit: text(doc.unit) ?? id, status: text(doc.status) ?? 'unknown', epoch: count(doc.epoch), progress: counts(doc.progress) };
}

/** Decodes a timeline event document. */
export function readEvent(id: string, data: unknown): EventView {
  const doc = fields(data);
  return { id, kind: text(doc.kind) ?? 'event', message: text(doc.message) ?? '', unit: text(doc.unit), atMs: count(doc.atMs) };
}

/** Decodes an effect ledger entry. */
export function readEffect(id: string, data: unknown): EffectView {
  const doc = fields(data);
  return { id, state: text(doc.state) ?? 'unknown', intent: text(doc.intent) ?? text(doc.description) ?? text(doc.kind) };
}

/** Decodes a published answer; null when the document holds no markdown (not an answer). */
export function readResult(data: unknown): ResultView | null {
  const doc = fields(data);
  const markdown = text(doc.markdown);
  if (markdown === null) return null;
  return { title: text(doc.title) ?? '', markdown, outcome: outcomeOf(doc.outcome), missing: strings(doc.missing) };
}

/** Decodes a recorded section document. */
export function readSection(data: unknown): SectionView {
  const doc = fields(data);
  const body = fields(doc.data);
  return {
    phase: text(doc.phase) ?? '',
    unit: text(doc.unit),
    id: text(doc.id) ?? '',
    seq: count(doc.seq),
    heading: text(body.heading),
    text: text(body.text),
    missing: body.missing === true,
    sources: (Array.isArray(body.sources) ? body.sources : []).map((source: unknown, index) => {
      const item = fields(source);
      return { number: index + 1, title: text(item.title) ?? '', url: text(item.url) ?? '' };
    }),
  };
}

/** Decodes a draft document. */
export function readDraft(data: unknown): DraftView {
  const doc = fields(data);
  return { phase: text(doc.phase) ?? '', unit: text(doc.unit), id: text(doc.id) ?? '', text: text(doc.text) ?? '', epoch: count(doc.epoch), updatedAtMs: count(doc.updatedAtMs) };
}

/** `phase/unit/id`: one key for a section and the draft that becomes it. */
export const sectionKeyOf = (section: { readonly phase: string; readonly unit: string | null; readonly id: string }): string => `${section.phase}/${section.unit ?? ''}/${section.id}`;

/**
 * The drafts worth showing while a job runs: of the current phase, with text, not yet recorded as
 * a section, and written under the latest claim of the job (or of its unit). A draft from an older
 * claim is a worker that lost its claim: its text will be written again, so it is left out.
 */
export function draftsInFlight(
  job: Pick<JobView, 'status' | 'phase' | 'epoch'>,
  sections: readonly Pick<SectionView, 'phase' | 'unit' | 'id'>[],
  drafts: readonly DraftView[],
  units: readonly Pick<UnitView, 'unit' | 'epoch'>[] = [],
): DraftView[] {
  if (job.status !== 'running') return [];
  const done = new Set(sections.map(sectionKeyOf));
  const unitEpochs = new Map(units.map((unit) => [unit.unit, unit.epoch]));
  const holderEpoch = (draft: DraftView): number => (draft.unit === null ? job.epoch : (unitEpochs.get(draft.unit) ?? 0));
  return drafts
    .filter((draft) => draft.phase === job.phase && draft.text.trim() !== '' && !done.has(sectionKeyOf(draft)) && draft.epoch >= holderEpoch(draft))
    .sort((a, b) => sectionKeyOf(a).localeCompare(sectionKeyOf(b), 'en', { numeric: true }));
}

/** Where the engine publishes a finished job's answer (the outbox; functions/src/store/paths.ts). */
export function outboxPath(job: Pick<JobView, 'id' | 'conversationId'>): string {
  return job.conversationId ? `conversations/${job.conversationId}/messages/${job.id}` : `jobs/${job.id}/results/final`;
}

/** Dollars with enough digits to show a simulated cost of a fraction of a cent. */
export function formatUsd(usd: number): string {
  if (usd === 0) return '$0';
  return usd >= 1 ? `$${usd.toFixed(2)}` : `$${usd.toPrecision(2)}`;
}

function plural(value: number, word: string): string {
  return `${value} ${word}${value === 1 ? '' : 's'}`;
}

/** One line from the job's `cost` map: spent, calls, and what was wasted on discarded work. */
export function formatCost(cost: Readonly<Record<string, number>>): string {
  const spent = `${formatUsd(cost.spentUsd ?? 0)} spent · ${plural(cost.modelCalls ?? 0, 'model call')} · ${plural(cost.toolCalls ?? 0, 'tool call')}`;
  const wastedModel = cost.wastedModelCalls ?? 0;
  const wastedTools = cost.wastedToolCalls ?? 0;
  const wastedUsd = cost.wastedUsd ?? 0;
  if (wastedModel === 0 && wastedTools === 0 && wastedUsd === 0) return `${spent} · nothing wasted`;
  return `${spent} · wasted: ${plural(wastedModel, 'model call')}, ${plural(wastedTools, 'tool call')}, ${formatUsd(wastedUsd)}`;
}

/** A sentence for people about where a job stands. */
export function describeStatus(job: JobView): string {
  switch (job.status) {
    case 'queued':
      return job.attempts > 0 ? `Queued to retry (attempt ${job.attempts + 1})` : 'Queued';
    case 'running':
      return job.phase ? `Working: ${job.phase}` : 'Working';
    case 'waiting':
      if (job.waiting?.reason === 'provider') return 'Waiting for the model provider to recover; resumes by itself';
      if (job.waiting?.reason === 'budget') return 'Paused at your daily spend limit';
      return 'Waiting for your answer';
    case 'completed':
      return job.outcome === 'partial' ? 'Finished, with parts missing' : 'Finished';
    case 'failed':
      return `Failed: ${job.lastError?.message ?? 'no reason recorded'}`;
    case 'cancelled':
      return 'Cancelled';
    case 'quarantined':
      return `Stopped for an operator to look at: ${job.quarantine?.reason ?? 'it kept stopping its workers'}`;
    case 'unknown':
      return 'Unknown status';
  }
}
