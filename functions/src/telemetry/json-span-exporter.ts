/**
 * The `console` trace exporter: each finished span is one JSON log line in Cloud Logging's shape,
 * with the trace fields, so a step's spans can be read (and found by trace) without a trace
 * backend. It imports types only: the SDK is loaded when spans are exported (tracing.ts).
 */
import type { ExportResult, ExportResultCode } from '@opentelemetry/core';
import type { ReadableSpan, SpanExporter } from '@opentelemetry/sdk-trace-base';
import { safeJson, SPAN_ID_FIELD, TRACE_FIELD, TRACE_SAMPLED_FIELD } from './logging';

const hrMs = ([seconds, nanos]: readonly [number, number]): number => seconds * 1000 + nanos / 1e6;

/** One finished span as a Cloud Logging line. */
export function spanLine(span: ReadableSpan, project: string | undefined): string {
  const { traceId, spanId, traceFlags } = span.spanContext();
  const durationMs = Math.round(hrMs(span.duration) * 1000) / 1000;
  return safeJson({
    severity: 'DEBUG',
    message: `span ${span.name} ${durationMs} ms`,
    ...(project ? { [TRACE_FIELD]: `projects/${project}/traces/${traceId}`, [SPAN_ID_FIELD]: spanId, [TRACE_SAMPLED_FIELD]: (traceFlags & 1) === 1 } : {}),
    span: {
      name: span.name,
      traceId,
      spanId,
      parentSpanId: span.parentSpanContext?.spanId ?? null,
      kind: span.kind,
      startTime: new Date(hrMs(span.startTime)).toISOString(),
      durationMs,
      status: span.status,
      attributes: span.attributes,
      events: span.events.map((event) => ({ name: event.name, atMs: hrMs(event.time), attributes: event.attributes })),
    },
  });
}

/** The `console` exporter: one JSON line per span. */
export class JsonLineSpanExporter implements SpanExporter {
  constructor(
    private readonly write: (line: string) => void,
    private readonly project: string | undefined,
    /** ExportResultCode.SUCCESS, handed in so that this module loads no SDK code (tracing.ts loads it when configured). */
    private readonly success: ExportResultCode,
  ) {}

  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    for (const span of spans) {
      try {
        this.write(spanLine(span, this.project));
      } catch {
        // One span that cannot be written does not stop the others.
      }
    }
    done({ code: this.success });
  }

  shutdown(): Promise<void> {
    return Promise.resolve();
  }
}
