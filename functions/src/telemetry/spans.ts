/**
 * Child spans of the current step: each starts under the step's span (or the active context outside
 * a step) with the step's fields as attributes, and ends when its work settles. Telemetry never
 * changes the work's result: what a span records is computed defensively, and its own failures are
 * swallowed.
 */
import { context, SpanKind, SpanStatusCode, trace, type Attributes, type Span } from '@opentelemetry/api';
import { currentStep, currentTracer, stepAttributes } from './scope';

/** What every span's work ended as: `ok`, or what went wrong, in words a dashboard can group by. */
export const OUTCOME_ATTRIBUTE = 'phaseline.outcome';

export interface ChildSpanOptions {
  readonly kind?: SpanKind;
  readonly attributes?: Attributes;
}

export function startChildSpan(name: string, options: ChildSpanOptions = {}): Span {
  const scope = currentStep();
  const parent = scope ? trace.setSpan(context.active(), scope.span) : context.active();
  return currentTracer().startSpan(name, { kind: options.kind ?? SpanKind.INTERNAL, attributes: { ...stepAttributes(scope?.fields), ...options.attributes } }, parent);
}

/** Runs `record` for its side effects on a span; a failure there is telemetry's, never the work's. */
export function safely(record: () => void): void {
  try {
    record();
  } catch {
    // A span that could not record something is still ended; the work goes on.
  }
}

/** The short name of what was thrown: a PhaselineError's code, an abort, or the error's class. */
export function errorOutcome(error: unknown, signal?: AbortSignal): string {
  if (signal?.aborted) return 'aborted';
  if (error !== null && typeof error === 'object') {
    const code = (error as { code?: unknown }).code;
    if (typeof code === 'string' && code !== '') return code;
    if (error instanceof Error && error.name === 'AbortError') return 'aborted';
  }
  return 'error';
}

export interface SpanHooks<T> {
  /** Attributes from the work's result. */
  readonly onResult?: (span: Span, value: T) => void;
  /** Attributes from what the work threw (after the exception is recorded). */
  readonly onError?: (span: Span, error: unknown) => void;
}

/**
 * Runs `work` inside `span` and ends it: a result sets the outcome `ok` (unless onResult set one),
 * a throw records the exception, sets the span's status to ERROR and rethrows it unchanged.
 */
export async function withSpan<T>(span: Span, work: () => Promise<T>, hooks: SpanHooks<T> = {}): Promise<T> {
  let value: T;
  try {
    value = await context.with(trace.setSpan(context.active(), span), work);
  } catch (error) {
    safely(() => {
      span.recordException(error instanceof Error ? error : String(error));
      span.setStatus({ code: SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
      span.setAttribute(OUTCOME_ATTRIBUTE, errorOutcome(error));
      hooks.onError?.(span, error);
      span.setAttributes(stepAttributes(currentStep()?.fields));
    });
    span.end();
    throw error;
  }
  safely(() => {
    span.setAttribute(OUTCOME_ATTRIBUTE, 'ok');
    hooks.onResult?.(span, value);
    // What the step learnt while this ran (the epoch a claim's commit gave it).
    span.setAttributes(stepAttributes(currentStep()?.fields));
  });
  span.end();
  return value;
}
