/**
 * One task request as a span and a scope: `job-step` (or `unit-step`) under the trace the request
 * named in its headers (so it joins Cloud Trace's view of the request), with the task's job, step,
 * unit and phase from its payload. Everything the step does runs inside the scope: log lines carry
 * its fields and trace, model calls, tool calls and commits become its children.
 */
import { ROOT_CONTEXT, SpanKind, trace, type Attributes, type Span, type Tracer } from '@opentelemetry/api';
import { currentTracer, runInStep, StepScope, stepAttributes, type StepFields } from './scope';
import { withSpan } from './spans';
import { incomingTrace, remoteSpanContext, type RequestHeaders } from './trace-headers';

export interface StepTraceOptions {
  /** The task request's headers (`X-Cloud-Trace-Context`, `traceparent`); absent or malformed: a new trace. */
  readonly headers?: RequestHeaders | undefined;
  /** The task payload as delivered: its job, step, unit and phase are read if they are there (it is validated elsewhere). */
  readonly task: unknown;
  /** Further attributes of the step span (the delivery's retry count, ...). */
  readonly attributes?: Attributes;
  /** The tracer of the step and its children; the global one (no-op until configured) by default. */
  readonly tracer?: Tracer;
}

/** What a payload says about its step, without trusting it: only well-typed fields are taken. */
export function taskFields(task: unknown): StepFields {
  if (task === null || typeof task !== 'object') return {};
  const { jobId, step, unit, phase } = task as Record<string, unknown>;
  return {
    ...(typeof jobId === 'string' ? { jobId } : {}),
    ...(typeof step === 'number' && Number.isFinite(step) ? { step } : {}),
    ...(typeof unit === 'string' ? { unit } : {}),
    ...(typeof phase === 'string' ? { phase } : {}),
  };
}

/**
 * Runs one step inside its span and scope. The step's result passes through unchanged (`describe`
 * may add attributes from it); a throw is recorded on the span and rethrown.
 */
export function traceStep<T>(options: StepTraceOptions, run: () => Promise<T>, describe?: (value: T) => Attributes): Promise<T> {
  const tracer = options.tracer ?? currentTracer();
  const incoming = incomingTrace(options.headers);
  const remote = remoteSpanContext(incoming);
  const parent = remote ? trace.setSpanContext(ROOT_CONTEXT, remote) : ROOT_CONTEXT;
  const fields = taskFields(options.task);
  const span: Span = tracer.startSpan(
    fields.unit === undefined ? 'job-step' : 'unit-step',
    { kind: SpanKind.SERVER, attributes: { ...stepAttributes(fields), ...options.attributes } },
    parent,
  );
  const scope = new StepScope(span, tracer, fields, incoming);
  return runInStep(scope, () => withSpan(span, run, describe ? { onResult: (recording, value) => recording.setAttributes(describe(value)) } : {}));
}
