/**
 * The job document as a reader sees it: the fields the engine writes (see functions/src/store/
 * codec.ts), read defensively from whatever a Firestore client hands over, plus the summaries the
 * chat page and `npm run demo` both show. No DOM and no Firebase imports: the page and the
 * terminal share it.
 */
import { cancellationReport, type StoppedEffectsView } from '../../functions/src/effects/stop-report';

export const JOB_STATUSES = ['queued', 'running', 'waiting', 'completed', 'failed', 'cancelled', 'quarantined'] as const;
export type JobStatus = (typeof JOB_STATUSES)[number];

/** Statuses a job can still leave by itself or through its owner. */
export const ACTIVE_STATUSES: ReadonlySet<string> = new Set(['queued', 'running', 'waiting']);
export const TERMINAL_STATUSES: ReadonlySet<string> = new Set(['completed', 'failed', 'cancelled', 'quarantined']);

/** The research pipeline's phases in order (functions/src/pipelines/research/pipeline.ts). */
export const RESEARCH_PHASES = ['outline', 'perspectives', 'expert-content', 'final-document'] as const;

export interface JobWaitView {
  readonly reason: 'decision' | 'provider' | 'budget';
  readonly questionId: string;
  readonly question: string;
  readonly options: readonly string[];
  readonly untilMs: number | null;
}

export interface JobView {
  readonly id: string;
  /** `unknown` if the document holds a status this page does not know. */
  readonly status: JobStatus | 'unknown';
  readonly outcome: 'complete' | 'partial' | null;
  readonly pipeline: string;
  readonly phase: string | null;
  /** The research question, when the input has one. */
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
  readonly decisions: Readonly<Record<string, string>>;
  readonly createdAtMs: number | null;
  readonly finishedAtMs: number | null;
}

export interface UnitView {
  readonly unit: string;
  readonly status: string;
  /** The fencing epoch of the unit's latest claim. */
  readonly epoch: number;
  readonly progress: Readonly<Record<string, number>>;
}

export interface EventView {
  readonly id: string;
  readonly kind: string;
  readonly message: string;
  readonly unit: string | null;
  readonly atMs: number;
}

export interface EffectView {
  readonly id: string;
  readonly state: string;
  /** What the effect was meant to do, when the ledger entry says. */
  readonly intent: string | null;
}

export interface ResultView {
  readonly title: string;
  readonly markdown: string;
  readonly outcome: 'complete' | 'partial' | null;
  readonly missing: readonly string[];
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

export function readUnit(id: string, data: unknown): UnitView {
  const doc = fields(data);
  return { unit: text(doc.unit) ?? id, status: text(doc.status) ?? 'unknown', epoch: count(doc.epoch), progress: counts(doc.progress) };
}

export function readEvent(id: string, data: unknown): EventView {
  const doc = fields(data);
  return { id, kind: text(doc.kind) ?? 'event', message: text(doc.message) ?? '', unit: text(doc.unit), atMs: count(doc.atMs) };
}

export function readEffect(id: string, data: unknown): EffectView {
  const doc = fields(data);
  return { id, state: text(doc.state) ?? 'unknown', intent: text(doc.intent) ?? text(doc.description) ?? text(doc.kind) };
}

export function readResult(data: unknown): ResultView | null {
  const doc = fields(data);
  const markdown = text(doc.markdown);
  if (markdown === null) return null;
  return { title: text(doc.title) ?? '', markdown, outcome: outcomeOf(doc.outcome), missing: strings(doc.missing) };
}

/** A recorded section (`jobs/{id}/sections`), as much of it as the live report shows. */
export interface SectionView {
  readonly phase: string;
  readonly unit: string | null;
  readonly id: string;
  readonly seq: number;
  /** The report section's heading and text, when the section is one (research's final-document phase). */
  readonly heading: string | null;
  readonly text: string | null;
  readonly missing: boolean;
  /** What the section's `[k]` markers cite: `sources[k-1]`. */
  readonly sources: readonly SourceView[];
}

/** One cited source of a report section. */
export interface SourceView {
  readonly number: number;
  readonly title: string;
  readonly url: string;
}

/** The text of a section in flight (`jobs/{id}/drafts`), as the model writes it. */
export interface DraftView {
  readonly phase: string;
  readonly unit: string | null;
  readonly id: string;
  readonly text: string;
  readonly epoch: number;
  readonly updatedAtMs: number;
}

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

export function readDraft(data: unknown): DraftView {
  const doc = fields(data);
  return { phase: text(doc.phase) ?? '', unit: text(doc.unit), id: text(doc.id) ?? '', text: text(doc.text) ?? '', epoch: count(doc.epoch), updatedAtMs: count(doc.updatedAtMs) };
}

/** The research pipeline's phase whose sections are the report, in order (functions/src/pipelines/research/pipeline.ts). */
export const REPORT_PHASE = 'final-document';

export interface LiveReport {
  /** Finished report sections with text, in report order. */
  readonly finished: readonly { readonly key: string; readonly heading: string; readonly text: string; readonly sources: readonly SourceView[] }[];
  /** Sections of the current phase being written now: not finished, with text so far. */
  readonly writing: readonly { readonly key: string; readonly label: string; readonly text: string }[];
}

const sectionKeyOf = (section: { readonly phase: string; readonly unit: string | null; readonly id: string }): string => `${section.phase}/${section.unit ?? ''}/${section.id}`;

/**
 * What the page shows while a job runs: the report's finished sections as they are recorded, in
 * report order (the order they are recorded in), and the drafts (one document per section, a
 * retry overwriting it) of the current phase's sections that are not finished yet. A draft from an
 * older claim than the job's (or its unit's) latest is a worker that lost its claim: not shown.
 */
export function liveReport(
  job: Pick<JobView, 'status' | 'phase' | 'epoch'>,
  sections: readonly SectionView[],
  drafts: readonly DraftView[],
  units: readonly Pick<UnitView, 'unit' | 'epoch'>[] = [],
): LiveReport {
  const finished = sections
    .filter((section) => section.phase === REPORT_PHASE && !section.missing && section.text !== null && section.text.trim() !== '')
    .sort((a, b) => a.seq - b.seq)
    .map((section) => ({ key: sectionKeyOf(section), heading: section.heading ?? section.id, text: section.text ?? '', sources: section.sources }));
  if (job.status !== 'running') return { finished, writing: [] };
  const done = new Set(sections.map(sectionKeyOf));
  const unitEpochs = new Map(units.map((unit) => [unit.unit, unit.epoch]));
  const holderEpoch = (draft: DraftView): number => (draft.unit === null ? job.epoch : (unitEpochs.get(draft.unit) ?? 0));
  const writing = drafts
    .filter((draft) => draft.phase === job.phase && draft.text.trim() !== '' && !done.has(sectionKeyOf(draft)) && draft.epoch >= holderEpoch(draft))
    .map((draft) => ({ key: sectionKeyOf(draft), label: draft.unit ? `${draft.unit} · ${draft.id}` : draft.id, text: draft.text }))
    .sort((a, b) => a.key.localeCompare(b.key, 'en', { numeric: true }));
  return { finished, writing };
}

/** Where the engine publishes a finished job's answer (the outbox; see functions/src/store/paths.ts). */
export function outboxPath(job: Pick<JobView, 'id' | 'conversationId'>): string {
  return job.conversationId ? `conversations/${job.conversationId}/messages/${job.id}` : `jobs/${job.id}/results/final`;
}

export interface ProgressSummary {
  /** 0 to 1, for a progress bar. An estimate: phases weigh the same. */
  readonly fraction: number;
  readonly phase: string | null;
  /** Expert sections across every fan-out unit. */
  readonly expertSections: { readonly done: number; readonly total: number; readonly skipped: number };
  /** Sections of the final report. */
  readonly reportSections: { readonly done: number; readonly total: number };
  /** Fan-out units (experts) finished, while a fan-out runs. */
  readonly units: { readonly done: number; readonly total: number } | null;
}

/**
 * Progress of a job from its document and its units. The fraction is exact at phase boundaries
 * and interpolated inside the fan-out (expert sections) and the final document (report sections).
 */
export function summarizeProgress(job: JobView, units: readonly UnitView[], phases: readonly string[] = RESEARCH_PHASES): ProgressSummary {
  const headings = job.progress.sectionsTotal ?? 0;
  const expertDone = units.reduce((sum, unit) => sum + (unit.progress.sectionsDone ?? 0), 0);
  const expertSkipped = units.reduce((sum, unit) => sum + (unit.progress.sectionsSkipped ?? 0), 0);
  const expertTotal = headings * Math.max(units.length, job.fanout?.units ?? 0);
  const reportDone = job.progress.documentSectionsDone ?? 0;
  const summary = {
    phase: job.phase,
    expertSections: { done: expertDone, total: expertTotal, skipped: expertSkipped },
    reportSections: { done: reportDone, total: headings },
    units: job.fanout ? { done: job.fanout.done, total: job.fanout.units } : null,
  };
  if (job.status === 'completed') return { ...summary, fraction: 1 };
  const index = job.phase === null ? -1 : phases.indexOf(job.phase);
  if (index < 0) return { ...summary, fraction: 0 };
  let within = 0;
  if (job.phase === 'expert-content' && expertTotal > 0) within = expertDone / expertTotal;
  else if (job.phase === 'final-document' && headings > 0) within = reportDone / headings;
  return { ...summary, fraction: Math.min(1, (index + Math.min(1, within)) / phases.length) };
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

/** A text progress bar for terminals, `width` cells wide. */
export function textBar(fraction: number, width = 24): string {
  const filled = Math.round(Math.max(0, Math.min(1, fraction)) * width);
  return `${'█'.repeat(filled)}${'░'.repeat(width - filled)}`;
}
