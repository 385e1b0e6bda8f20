/**
 * What the chat page and `npm run demo` show of a research job beyond the generic job model
 * (client/job-model.ts): the report as it is written, and progress through the research phases.
 * Research-specific, so it lives with the page rather than in the client a custom frontend uses.
 */
import { draftsInFlight, sectionKeyOf, type DraftView, type JobView, type SectionView, type SourceView, type UnitView } from '../../client';

/** The research pipeline's input, as the chat page's composer fills it in. */
export interface ResearchRequest {
  readonly question: string;
  readonly experts: number;
  readonly sections: number;
  readonly wordsPerSection: number;
}

/** The research pipeline's phases in order (functions/src/pipelines/research/pipeline.ts). */
export const RESEARCH_PHASES = ['outline', 'perspectives', 'expert-content', 'final-document'] as const;

/** The research pipeline's phase whose sections are the report, in order (functions/src/pipelines/research/pipeline.ts). */
export const REPORT_PHASE = 'final-document';

export interface LiveReport {
  /** Finished report sections with text, in report order. */
  readonly finished: readonly { readonly key: string; readonly heading: string; readonly text: string; readonly sources: readonly SourceView[] }[];
  /** Sections of the current phase being written now: not finished, with text so far. */
  readonly writing: readonly { readonly key: string; readonly label: string; readonly text: string }[];
}

/**
 * What the page shows while a job runs: the report's finished sections as they are recorded, in
 * report order (the order they are recorded in), and the drafts in flight (client's
 * `draftsInFlight`: the current phase's, unfinished, from the latest claim).
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
  const writing = draftsInFlight(job, sections, drafts, units).map((draft) => ({ key: sectionKeyOf(draft), label: draft.unit ? `${draft.unit} · ${draft.id}` : draft.id, text: draft.text }));
  return { finished, writing };
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


/** A text progress bar for terminals, `width` cells wide. */
export function textBar(fraction: number, width = 24): string {
  const filled = Math.round(Math.max(0, Math.min(1, fraction)) * width);
  return `${'█'.repeat(filled)}${'░'.repeat(width - filled)}`;
}
