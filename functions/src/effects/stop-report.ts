/**
 * The words for a stopped job's effects and for a cancellation, rendered from the structured
 * fields the job document stores (core/job.ts `Cancellation`). Nothing ever reads these words
 * back: a change of state changes the fields, and the sentence is rendered again where shown
 * (the cancel answer, the CLI, the chat page). No imports, so the chat page bundles it as it is.
 */

/** Ledger entries by state. */
export interface EffectStateCounts {
  readonly planned: number;
  readonly applying: number;
  readonly applied: number;
  readonly unknown: number;
  readonly failed: number;
}

export interface StoppedEffectsView {
  readonly counts: EffectStateCounts;
  readonly settled: boolean;
  readonly checkedWith: string | null;
}

export interface CancellationView {
  readonly reason: string;
  /** The operator who cancelled; null (or absent) when the owner did. */
  readonly by?: string | null;
  readonly phase: string | null;
  readonly sectionsDone: number | null;
  readonly effects: StoppedEffectsView | null;
}

/** The three figures a person cares about: applied, provably not applied, nobody knows yet. */
export function effectFigures(counts: EffectStateCounts): { readonly applied: number; readonly notApplied: number; readonly unknown: number } {
  return { applied: counts.applied, notApplied: counts.planned + counts.failed, unknown: counts.applying + counts.unknown };
}

export function stoppedEffectsSentence(effects: StoppedEffectsView): string {
  const { applied, notApplied, unknown } = effectFigures(effects.counts);
  const figures = `Effects: ${applied} applied, ${notApplied} not applied, ${unknown} unknown`;
  if (effects.settled) return `${figures} (final${effects.checkedWith === null ? '' : `, checked with ${effects.checkedWith}`}).`;
  if (effects.checkedWith === null) return `${figures} (being checked).`;
  return `${figures} (not yet confirmed by ${effects.checkedWith}; checked again later).`;
}

export function cancellationReport(cancellation: CancellationView): string {
  return [
    `Cancelled by ${cancellation.by ? `operator ${cancellation.by}` : 'its owner'} during ${cancellation.phase ?? 'its first step'} (${cancellation.reason}).`,
    ...(cancellation.sectionsDone === null ? [] : [`${cancellation.sectionsDone} sections were finished.`]),
    ...(cancellation.effects === null
      ? []
      : [stoppedEffectsSentence(cancellation.effects), 'Effects already applied (messages sent, payments made) cannot be undone by cancelling.']),
  ].join(' ');
}
