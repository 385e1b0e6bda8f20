/** bench/results/results.svg: small multiples drawn by hand, no chart library. */
import type { Implementation } from '../scenarios/compare';
import { fmt, LABELS } from './markdown';
import type { BenchResults } from './results';
import type { ImplementationSummary } from './summary';

const PANEL_W = 460;
const PANEL_H = 210;
const GAP = 20;
const COLORS = { base: '#9aa5b1', extra: '#e4572e', phaseline: '#2e86ab', baseline: '#9aa5b1', alt: '#f3a712', grid: '#e5e7eb', text: '#1f2933' } as const;

/** Whole numbers without decimals, medians that fell between two samples with one. */
const digitsFor = (value: number): number => (Number.isInteger(value) ? 0 : 1);

const escape = (text: string): string => text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

interface Segment {
  readonly value: number;
  readonly color: string;
}

interface Bar {
  readonly label: string;
  readonly segments: readonly Segment[];
  /** Printed at the end of the bar; defaults to the total. */
  readonly note?: string;
}

function text(x: number, y: number, content: string, options: { size?: number; anchor?: 'start' | 'middle' | 'end'; weight?: string; fill?: string } = {}): string {
  return `<text x="${x.toFixed(1)}" y="${y.toFixed(1)}" font-size="${options.size ?? 11}" text-anchor="${options.anchor ?? 'start'}"${options.weight ? ` font-weight="${options.weight}"` : ''} fill="${options.fill ?? COLORS.text}">${escape(content)}</text>`;
}

function niceMax(value: number): number {
  if (!(value > 0)) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * magnitude) return step * magnitude;
  return 10 * magnitude;
}

/** A panel of horizontal (optionally stacked) bars on one linear scale. */
function barPanel(x: number, y: number, title: string, subtitle: string, bars: readonly Bar[], legend: readonly { label: string; color: string }[] = []): string {
  const parts: string[] = [];
  parts.push(`<g transform="translate(${x},${y})">`);
  parts.push(`<rect width="${PANEL_W}" height="${PANEL_H}" fill="#ffffff" stroke="${COLORS.grid}"/>`);
  parts.push(text(12, 20, title, { size: 13, weight: '600' }));
  parts.push(text(12, 36, subtitle, { size: 10, fill: '#52606d' }));
  const left = 150;
  const right = PANEL_W - 90;
  const top = legend.length > 0 ? 64 : 50;
  const bottom = PANEL_H - 24;
  const scale = niceMax(Math.max(...bars.map((bar) => bar.segments.reduce((sum, segment) => sum + segment.value, 0))));
  const tickDigits = Number.isInteger(scale / 4) ? 0 : Number.isInteger((scale / 4) * 10) ? 1 : 2;
  for (let tick = 0; tick <= 4; tick += 1) {
    const tx = left + ((right - left) * tick) / 4;
    parts.push(`<line x1="${tx}" y1="${top - 4}" x2="${tx}" y2="${bottom}" stroke="${COLORS.grid}"/>`);
    parts.push(text(tx, bottom + 13, fmt((scale * tick) / 4, tickDigits), { size: 9, anchor: 'middle', fill: '#52606d' }));
  }
  const slot = (bottom - top) / Math.max(1, bars.length);
  const height = Math.min(22, slot * 0.7);
  bars.forEach((bar, index) => {
    const by = top + slot * index + (slot - height) / 2;
    parts.push(text(left - 8, by + height / 2 + 4, bar.label, { anchor: 'end' }));
    let cursor = left;
    for (const segment of bar.segments) {
      const width = ((right - left) * Math.max(0, segment.value)) / scale;
      parts.push(`<rect x="${cursor.toFixed(1)}" y="${by.toFixed(1)}" width="${width.toFixed(1)}" height="${height.toFixed(1)}" fill="${segment.color}"/>`);
      cursor += width;
    }
    const total = bar.segments.reduce((sum, segment) => sum + segment.value, 0);
    parts.push(text(cursor + 4, by + height / 2 + 4, bar.note ?? fmt(total, total < 10 ? 1 : 0), { size: 10 }));
  });
  legend.forEach((item, index) => {
    const lx = 12 + index * 110;
    parts.push(`<rect x="${lx}" y="43" width="10" height="10" fill="${item.color}"/>`);
    parts.push(text(lx + 14, 52, item.label, { size: 10 }));
  });
  parts.push('</g>');
  return parts.join('\n');
}

/** Job-document writes as ticks on a time line, with the section pace. */
function timelinePanel(x: number, y: number, results: BenchResults): string {
  const rates = results.writeRate?.summary ?? [];
  const parts: string[] = [`<g transform="translate(${x},${y})">`, `<rect width="${PANEL_W}" height="${PANEL_H}" fill="#ffffff" stroke="${COLORS.grid}"/>`];
  parts.push(text(12, 20, 'Job-document writes over one step', { size: 13, weight: '600' }));
  parts.push(text(12, 36, 'each tick is a write (claim, progress flushes, hand-off); real flusher, real timers', { size: 10, fill: '#52606d' }));
  const left = 150;
  const right = PANEL_W - 20;
  const spanMs = Math.max(1_000, ...rates.map((rate) => rate.exampleOffsetsMs.at(-1) ?? 0));
  const scale = Math.ceil(spanMs / 1000) * 1000;
  const bottom = PANEL_H - 24;
  for (let second = 0; second <= scale / 1000; second += 1) {
    const tx = left + ((right - left) * second * 1000) / scale;
    parts.push(`<line x1="${tx.toFixed(1)}" y1="50" x2="${tx.toFixed(1)}" y2="${bottom}" stroke="${COLORS.grid}"/>`);
    parts.push(text(tx, bottom + 13, `${second} s`, { size: 9, anchor: 'middle', fill: '#52606d' }));
  }
  const slot = (bottom - 50) / Math.max(1, rates.length);
  rates.forEach((rate, index) => {
    const cy = 50 + slot * index + slot / 2;
    parts.push(text(left - 8, cy - 2, `${fmt(rate.sectionsPerSecond, 1)} sections/s`, { anchor: 'end' }));
    parts.push(text(left - 8, cy + 11, `${fmt(rate.jobWrites)} writes`, { anchor: 'end', size: 10, fill: '#52606d' }));
    parts.push(`<line x1="${left}" y1="${cy}" x2="${right}" y2="${cy}" stroke="#cbd2d9"/>`);
    for (const offset of rate.exampleOffsetsMs) {
      const tx = left + ((right - left) * offset) / scale;
      parts.push(`<line x1="${tx.toFixed(1)}" y1="${cy - 9}" x2="${tx.toFixed(1)}" y2="${cy + 9}" stroke="${COLORS.phaseline}" stroke-width="2.5"/>`);
    }
  });
  parts.push('</g>');
  return parts.join('\n');
}

const ORDER: readonly Implementation[] = ['phaseline', 'whole-job', 'phase-checkpoints'];

function rows(summary: readonly ImplementationSummary[]): ImplementationSummary[] {
  return ORDER.flatMap((name) => summary.filter((item) => item.implementation === name));
}

const colorOf = (implementation: Implementation): string => (implementation === 'phaseline' ? COLORS.phaseline : COLORS.baseline);

export function renderSvg(results: BenchResults): string {
  const panels: string[] = [];
  const at = (index: number): [number, number] => [GAP + (index % 2) * (PANEL_W + GAP), 60 + Math.floor(index / 2) * (PANEL_H + GAP)];
  const summary = rows(results.comparison?.summary ?? []);
  const latency = results.meta.modelLatencyMs;
  let index = 0;
  if (summary.length > 0) {
    panels.push(
      barPanel(
        ...at(index++),
        'Model calls per job with faults',
        'red: the same request sent again (median of repeats)',
        summary.map((item) => ({
          label: LABELS[item.implementation],
          segments: [
            { value: item.modelCallsFaulted - item.repeatedModelCalls, color: COLORS.base },
            { value: item.repeatedModelCalls, color: COLORS.extra },
          ],
          note: `${fmt(item.modelCallsFaulted, digitsFor(item.modelCallsFaulted))} (${fmt(item.repeatedModelCalls, digitsFor(item.repeatedModelCalls))} repeated)`,
        })),
        [
          { label: 'first time', color: COLORS.base },
          { label: 'repeated', color: COLORS.extra },
        ],
      ),
    );
    const sensitivity = rows(results.sensitivity?.summary ?? []);
    const wallBars: Bar[] = summary.map((item) => ({ label: LABELS[item.implementation], segments: [{ value: item.wallMsFaulted / 1000, color: colorOf(item.implementation) }], note: `${fmt(item.wallMsFaulted / 1000, 2)} s @ ${latency} ms` }));
    for (const item of sensitivity) {
      wallBars.push({ label: LABELS[item.implementation], segments: [{ value: item.wallMsFaulted / 1000, color: COLORS.alt }], note: `${fmt(item.wallMsFaulted / 1000, 2)} s @ ${results.sensitivity?.latencyMs ?? '?'} ms` });
    }
    panels.push(
      barPanel(
        ...at(index++),
        'Wall time to completion with faults (s)',
        `real time per job; model calls take ${latency} ms${sensitivity.length > 0 ? ` (blue, grey) or ${results.sensitivity?.latencyMs ?? '?'} ms (amber)` : ''}`,
        wallBars,
      ),
    );
    panels.push(
      barPanel(
        ...at(index++),
        'Published results per job with faults',
        'a frozen worker wakes after its replacement finished',
        summary.map((item) => ({ label: LABELS[item.implementation], segments: [{ value: item.publishedFaulted, color: colorOf(item.implementation) }] })),
      ),
    );
    panels.push(
      barPanel(
        ...at(index++),
        'Firestore writes per job (fault-free)',
        'counted on the wire of the implementation\'s client',
        summary.map((item) => ({ label: LABELS[item.implementation], segments: [{ value: item.writesFaultFree, color: colorOf(item.implementation) }] })),
      ),
    );
  }
  if (results.writeRate) panels.push(timelinePanel(...at(index++), results));
  if (results.sweeper) {
    panels.push(
      barPanel(
        ...at(index++),
        'Documents read per sweep',
        `with ${results.sweeper.summary[0]?.expired ?? '?'} expired leases; grey: the same query without the range index`,
        results.sweeper.summary.flatMap((row) => [
          { label: `${fmt(row.totalJobs)} jobs`, segments: [{ value: row.documentsRead, color: COLORS.phaseline }] },
          { label: `${fmt(row.totalJobs)} jobs, no index`, segments: [{ value: row.equalityOnlyReads, color: COLORS.baseline }] },
        ]),
      ),
    );
  }
  const height = 60 + Math.ceil(index / 2) * (PANEL_H + GAP);
  const width = GAP * 3 + PANEL_W * 2;
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, -apple-system, Segoe UI, sans-serif">`,
    `<rect width="${width}" height="${height}" fill="#f8fafc"/>`,
    text(GAP, 30, 'Phaseline benchmarks', { size: 18, weight: '700' }),
    text(GAP, 48, `${results.meta.finishedAt.slice(0, 10)} · ${results.meta.machine.cpus} CPUs · official Firestore emulator · ${latency} ms per model call · medians of ${results.meta.repeats} repeats`, { size: 11, fill: '#52606d' }),
    ...panels,
    '</svg>',
    '',
  ].join('\n');
}
