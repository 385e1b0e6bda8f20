/**
 * Pure formatting of jobs and timelines for a terminal: no I/O, every clock and zone passed in.
 * Text that a model, a user or a document wrote (reports, event messages, questions, errors, owner
 * IDs, job, pipeline and phase names) goes through `terminalText` first, so it cannot carry escape
 * sequences to the terminal.
 */
import { BUDGET_RESUME } from '../../functions/src/core/lifecycle';
import { cancellationReport } from '../../functions/src/effects/stop-report';
import type { SweepReport } from '../../functions/src/engine/sweeper';
import type { EventView, JobView } from './views';

export interface TimeOptions {
  /** IANA time zone for clock times; the machine's own when absent. */
  readonly timeZone?: string;
}

// ---- Text from models and documents -------------------------------------------------------------

/**
 * Control characters a terminal acts on: C0 but tab (ESC starts colour, cursor, title, clipboard
 * and hyperlink sequences; CR rewrites the line; BS erases), DEL, C1 (CSI and OSC have one-byte
 * forms), and the bidirectional controls that make text display in another order than it reads.
 */
function isTerminalControl(code: number): boolean {
  return (
    (code < 0x20 && code !== 0x09) ||
    (code >= 0x7f && code <= 0x9f) ||
    code === 0x061c ||
    code === 0x200e ||
    code === 0x200f ||
    (code >= 0x202a && code <= 0x202e) ||
    (code >= 0x2066 && code <= 0x2069)
  );
}

/** `text` on one line, every control character shown as an escape (`\x1b`, `\n`, `\u202e`) so it prints as written. */
export function terminalText(text: string): string {
  let shown = '';
  for (const character of text) {
    const code = character.codePointAt(0) ?? 0;
    if (!isTerminalControl(code)) shown += character;
    else if (character === '\n') shown += '\\n';
    else shown += code <= 0xff ? `\\x${code.toString(16).padStart(2, '0')}` : `\\u${code.toString(16).padStart(4, '0')}`;
  }
  return shown;
}

/** The URL if it is an absolute http(s) one, the only kind a report may show as a link. */
function webUrl(target: string): string | null {
  const trimmed = target.trim().replace(/^<(.*)>$/, '$1');
  if (!/^https?:\/\//i.test(trimmed)) return null;
  try {
    return new URL(trimmed).protocol.startsWith('http') ? trimmed : null;
  } catch {
    return null;
  }
}

/** `[label](target "title")` or an image `![alt](target)`, with the target in angle brackets or not. */
const INLINE_LINK = /!?\[([^\]\n]*)\]\(\s*(<[^>\n]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:"[^"\n]*"|'[^'\n]*'))?\s*\)/g;
/** `<scheme:...>` */
const AUTOLINK = /<([a-z][a-z0-9+.-]{1,31}:[^<>\s]*)>/gi;
/** `[1]: https://... "Title"`, a reference definition (the numbered references a report ends with). */
const REFERENCE_DEFINITION = /^( {0,3}\[[^\]\n]+\]:)\s*(<[^>\n]*>|\S+)(.*)$/;

/** One report line with its links made plain: http(s) targets shown as `<url>`, any other target dropped. */
function reportLine(line: string): string {
  const definition = REFERENCE_DEFINITION.exec(line);
  if (definition) {
    const [, label = '', target = '', rest = ''] = definition;
    const url = webUrl(target);
    return url === null ? `${label} (link removed: not an http(s) URL)` : `${label} ${url}${rest}`;
  }
  return line
    .replace(INLINE_LINK, (_link, label: string, target: string) => {
      const url = webUrl(target);
      if (url === null) return label;
      return label === '' || label === url ? `<${url}>` : `${label} <${url}>`;
    })
    .replace(AUTOLINK, (autolink, target: string) => (webUrl(target) === null ? target : autolink));
}

/**
 * A published report as lines for a terminal: the Markdown kept as it reads, links made safe
 * (only http(s) URLs are shown, so a terminal links nothing else) and control characters escaped.
 */
export function reportLines(markdown: string): string[] {
  return markdown.split(/\r?\n/).map((line) => terminalText(reportLine(line)));
}

// ---- Time ----------------------------------------------------------------------------------------

function timeParts(ms: number, options: TimeOptions): Record<string, string> {
  const format = new Intl.DateTimeFormat('en-GB', {
    year: 'numeric',
    month: '2-digit',
    day: '2-digit',
    hour: '2-digit',
    minute: '2-digit',
    second: '2-digit',
    hourCycle: 'h23',
    ...(options.timeZone === undefined ? {} : { timeZone: options.timeZone }),
  });
  return Object.fromEntries(format.formatToParts(new Date(ms)).map((part) => [part.type, part.value]));
}

/** `14:03:27` */
export function clockTime(ms: number, options: TimeOptions = {}): string {
  const parts = timeParts(ms, options);
  return `${parts.hour ?? '??'}:${parts.minute ?? '??'}:${parts.second ?? '??'}`;
}

/** `2026-01-31 14:03` */
export function dateTime(ms: number, options: TimeOptions = {}): string {
  const parts = timeParts(ms, options);
  return `${parts.year ?? '????'}-${parts.month ?? '??'}-${parts.day ?? '??'} ${parts.hour ?? '??'}:${parts.minute ?? '??'}`;
}

/** `850 ms`, `42 s`, `3m 05s`, `2h 07m` */
export function duration(ms: number): string {
  const value = Math.max(0, Math.round(ms));
  if (value < 1_000) return `${value} ms`;
  const seconds = Math.floor(value / 1_000);
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes}m ${String(seconds % 60).padStart(2, '0')}s`;
  return `${Math.floor(minutes / 60)}h ${String(minutes % 60).padStart(2, '0')}m`;
}

// ---- Progress ------------------------------------------------------------------------------------

export const BAR_WIDTH = 24;

/** `[██████░░░░░░]`: `fraction` of the width filled, clamped to [0, 1]. */
export function progressBar(fraction: number, width = BAR_WIDTH): string {
  const clamped = Number.isFinite(fraction) ? Math.min(1, Math.max(0, fraction)) : 0;
  const filled = Math.round(clamped * width);
  return `[${'█'.repeat(filled)}${'░'.repeat(width - filled)}]`;
}

export interface Progress {
  /** Share of the current phase done, or null when the job reports nothing to measure it by. */
  readonly fraction: number | null;
  /** What is being measured: `final-document: 2/3 sections`. */
  readonly detail: string;
}

/**
 * How far the job is, from what it reports. A fan-out in progress counts its units; otherwise
 * the sections of the current phase count (`sectionsTotal` with `documentSectionsDone` or
 * `sectionsDone`, the names the bundled pipelines report). A completed job is whole.
 */
export function progressOf(job: Pick<JobView, 'status' | 'phase' | 'progress' | 'fanout'>): Progress {
  if (job.status === 'completed') return { fraction: 1, detail: 'done' };
  const phase = job.phase === null ? (job.status === 'queued' ? 'not started' : 'starting') : terminalText(job.phase);
  const fanout = job.fanout;
  if (fanout !== null && fanout.units > 0) {
    return { fraction: fanout.done / fanout.units, detail: `${terminalText(fanout.phase)}: ${fanout.done}/${fanout.units} units` };
  }
  const total = job.progress.sectionsTotal;
  if (total !== undefined && total > 0) {
    const done = job.progress.documentSectionsDone ?? job.progress.sectionsDone ?? 0;
    return { fraction: done / total, detail: `${phase}: ${done}/${total} sections` };
  }
  return { fraction: null, detail: phase };
}

/** `$0.0123 · 14 model calls · 9 tool calls`, or null when nothing was spent or counted. */
export function costSummary(cost: Readonly<Record<string, number>>): string | null {
  const parts: string[] = [];
  const usd = cost.spentUsd;
  if (usd !== undefined) parts.push(`$${usd.toFixed(usd >= 1 ? 2 : 4)}`);
  if (cost.modelCalls !== undefined) parts.push(`${cost.modelCalls} model call${cost.modelCalls === 1 ? '' : 's'}`);
  if (cost.toolCalls !== undefined) parts.push(`${cost.toolCalls} tool call${cost.toolCalls === 1 ? '' : 's'}`);
  return parts.length === 0 ? null : parts.join(' · ');
}

function percent(fraction: number | null): string {
  return fraction === null ? '  --' : `${String(Math.floor(Math.min(1, Math.max(0, fraction)) * 100)).padStart(3)}%`;
}

/** What the job is doing or why it stopped, in a few words. */
export function stateDetail(job: JobView, options: TimeOptions = {}): string {
  switch (job.status) {
    case 'waiting':
      if (job.waiting?.reason === 'decision') return `needs your decision: ${terminalText(job.waiting.question)}`;
      if (job.waiting?.reason === 'budget') return `paused at the daily spend limit${job.waiting.untilMs === null ? '' : ` until ${dateTime(job.waiting.untilMs, options)}`}`;
      return job.waiting?.untilMs != null ? `provider unavailable; resumes by itself at ${clockTime(job.waiting.untilMs, options)}` : 'waiting';
    case 'failed':
      return `failed: ${terminalText(job.lastError?.message ?? 'no reason recorded')}`;
    case 'cancelled':
      return `cancelled${job.cancellation?.by ? ` by operator ${terminalText(job.cancellation.by)}` : ''}: ${terminalText(job.cancellation?.reason ?? 'no reason recorded')}`;
    case 'quarantined':
      return `quarantined: ${terminalText(job.quarantine?.reason ?? 'no reason recorded')}`;
    case 'completed':
      return job.outcome === 'partial' ? 'completed, partial' : 'completed';
    case 'queued':
      return job.lastError && job.phase !== null ? `retrying ${terminalText(job.phase)} after ${terminalText(job.lastError.code)}` : progressOf(job).detail;
    case 'running':
      return progressOf(job).detail;
  }
}

/** The progress line `watch` keeps redrawing: `running     [██████░░░░]  50%  final-document: 2/4 sections · $0.0021`. */
export function statusLine(job: JobView, options: TimeOptions & { readonly width?: number } = {}): string {
  const { fraction } = progressOf(job);
  const cost = costSummary(job.cost);
  return `${job.status.padEnd(11)} ${progressBar(fraction ?? 0, options.width)} ${percent(fraction)}  ${stateDetail(job, options)}${cost === null ? '' : ` · ${cost}`}`;
}

// ---- Timeline ------------------------------------------------------------------------------------

/** Events in the order they happened: by time, then by ID (job events are numbered in order). */
export function byTime(a: EventView, b: EventView): number {
  return a.atMs - b.atMs || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
}

/** `14:03:27  checkpointed  [e1] Section h2 recorded` */
export function timelineLine(event: EventView, options: TimeOptions = {}): string {
  const unit = event.unit === null ? '' : `[${terminalText(event.unit)}] `;
  return `${clockTime(event.atMs, options)}  ${terminalText(event.kind).padEnd(13)} ${unit}${terminalText(event.message)}`;
}

// ---- The end of a watch --------------------------------------------------------------------------

/** What the person should know once the watch stops, and what they can do next. */
export function finalLines(job: JobView, resultPath: string, options: TimeOptions = {}): string[] {
  const took = job.finishedAtMs === null ? '' : ` in ${duration(job.finishedAtMs - job.createdAtMs)}`;
  const cost = costSummary(job.cost);
  const spent = cost === null ? [] : [`Cost: ${cost}`];
  switch (job.status) {
    case 'completed':
      return [`Completed${job.outcome === 'partial' ? ' (partial: some parts are missing, named in the report)' : ''}${took}.`, `Report: ${resultPath}`, ...spent];
    case 'waiting': {
      const waiting = job.waiting;
      if (waiting?.reason === 'budget') {
        const resumes = waiting.untilMs === null ? 'It waits' : `It resumes by itself at ${dateTime(waiting.untilMs, options)}`;
        return [
          `Paused at the daily spend limit: ${terminalText(waiting.question)}`,
          `${resumes}. Once an operator has raised the limit, resume it sooner with: phaseline decide ${terminalText(job.id)} ${terminalText(waiting.questionId)} ${BUDGET_RESUME}`,
          `Or stop it: phaseline cancel ${terminalText(job.id)}`,
        ];
      }
      if (waiting?.reason !== 'decision') return [`Waiting: ${stateDetail(job, options)}.`];
      return [
        `Waiting for your decision: ${terminalText(waiting.question)}`,
        `Options: ${waiting.options.map((option) => `"${terminalText(option)}"`).join(', ')}`,
        `Answer with: phaseline decide ${terminalText(job.id)} ${terminalText(waiting.questionId)} <option>`,
      ];
    }
    case 'failed':
      return [`Failed${took}: ${terminalText(job.lastError?.message ?? 'no reason recorded')}${job.lastError ? ` (${terminalText(job.lastError.code)})` : ''}`, ...spent];
    case 'cancelled':
      return [`Cancelled${took}.`, ...(job.cancellation ? [terminalText(cancellationReport(job.cancellation))] : []), ...spent];
    case 'quarantined':
      return [
        `Quarantined${took}: ${terminalText(job.quarantine?.reason ?? 'no reason recorded')}.`,
        `It keeps killing its workers; once the cause is fixed an operator can run: phaseline release ${terminalText(job.id)}`,
        ...spent,
      ];
    case 'queued':
    case 'running':
      return [`${job.status}: ${stateDetail(job, options)}`];
  }
}

// ---- Lists ---------------------------------------------------------------------------------------

/** Left-aligned columns, two spaces apart; the last column is not padded. */
export function table(header: readonly string[], rows: readonly (readonly string[])[]): string[] {
  const widths = header.map((title, column) => Math.max(title.length, ...rows.map((row) => (row[column] ?? '').length)));
  const line = (cells: readonly string[]): string =>
    cells
      .map((cell, column) => (column === cells.length - 1 ? cell : cell.padEnd(widths[column] ?? 0)))
      .join('  ')
      .trimEnd();
  return [line(header), ...rows.map(line)];
}

function truncate(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, max - 1)}…`;
}

export function jobTable(jobs: readonly JobView[], options: TimeOptions & { readonly withOwner?: boolean } = {}): string[] {
  if (jobs.length === 0) return ['No jobs.'];
  const header = ['JOB', 'STATUS', 'PIPELINE', 'PROGRESS', 'CREATED', ...(options.withOwner ? ['OWNER'] : []), 'DETAIL'];
  const rows = jobs.map((job) => [
    terminalText(job.id),
    job.status,
    terminalText(job.pipeline),
    percent(progressOf(job).fraction).trim(),
    dateTime(job.createdAtMs, options),
    ...(options.withOwner ? [terminalText(job.owner)] : []),
    truncate(stateDetail(job, options), 60),
  ]);
  return table(header, rows);
}

// ---- Sweeps --------------------------------------------------------------------------------------

const count = (n: number, one: string, many = `${one}s`): string => `${n} ${n === 1 ? one : many}`;

/** What one sweep did, in a few lines. */
export function sweepReportLines(report: SweepReport): string[] {
  const lines = [
    `Sweep at ${new Date(report.nowMs).toISOString()}:`,
    `  reclaimed      ${count(report.reclaimed, 'expired job lease')}, ${count(report.unitsReclaimed, 'expired unit lease')}`,
    `  quarantined    ${count(report.quarantined, 'job')}`,
    `  re-dispatched  ${count(report.redispatched, 'job')} and ${count(report.unitsRedispatched, 'unit')} whose task went missing`,
    `  resumed        ${count(report.resumed, 'job')} whose provider wait was over`,
    `  parked         ${count(report.parkedUnits, 'leftover unit')}`,
    `  left alone     ${count(report.skipped, 'document')} that changed since the query`,
    `  tasks          ${report.enqueued} enqueued, ${report.enqueueFailures} failed (a failed one is dispatched again by a later sweep)`,
    `  read           ${count(report.documentsRead, 'document')} in ${count(report.queryPages, 'query page')}`,
    `  effects        ${count(report.stoppedEffects.checked, 'stopped job')} checked with the system of record: ` +
      `${report.stoppedEffects.settled} settled, ${report.stoppedEffects.pending} still unknown, ${report.stoppedEffects.deferred} in their grace period`,
    `  retention      ${count(report.retention.documentsStamped, 'document')} of ended jobs given expireAt: ` +
      `${count(report.retention.jobsStamped, 'job')} done, ${report.retention.jobsContinued + report.retention.jobsDeferred} to go on next sweep`,
  ];
  const errors = report.errors + report.stoppedEffects.errors + report.retention.errors;
  const truncated = [...report.truncated, ...report.stoppedEffects.truncated];
  if (errors > 0) lines.push(`  errors         ${errors} (see the warnings above; the next sweep tries again)`);
  if (truncated.length > 0) lines.push(`  unfinished     ${truncated.join(', ')} hit the page limit; the next sweep continues`);
  return lines;
}
