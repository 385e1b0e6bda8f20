/**
 * The trace a task request belongs to, read from its headers: Google's `X-Cloud-Trace-Context`
 * (`TRACE_ID/SPAN_ID;o=OPTIONS`, the span ID in decimal) or W3C `traceparent`
 * (`00-TRACE_ID-SPAN_ID-FLAGS`). A malformed or missing header is no trace, never an error: a step
 * runs the same with or without one.
 *
 * When both are present and valid, `X-Cloud-Trace-Context` wins: it is the trace Cloud Run's request
 * log and firebase-functions' logger use, so the step's own lines and spans join the same trace.
 * Google's front end sets the two to the same trace anyway.
 */
import { TraceFlags, type SpanContext } from '@opentelemetry/api';

/** Request headers as Node and express hand them over (lower-case names), or any casing. */
export type RequestHeaders = Readonly<Record<string, string | readonly string[] | undefined>>;

export interface IncomingTrace {
  /** 32 lower-case hex digits, never all zeros. */
  readonly traceId: string;
  /** 16 lower-case hex digits, never all zeros; absent when the header named a trace but no span. */
  readonly spanId?: string;
  readonly sampled: boolean;
  readonly source: 'x-cloud-trace-context' | 'traceparent';
}

const CLOUD_TRACE = /^([0-9a-fA-F]{32})(?:\/([0-9]{1,20}))?(?:;o=([0-9]+))?$/;
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;
const ZEROS = /^0+$/;
const MAX_SPAN_ID = (1n << 64n) - 1n;

function header(headers: RequestHeaders | undefined, name: string): string | undefined {
  if (!headers) return undefined;
  const wanted = name.toLowerCase();
  for (const [key, value] of Object.entries(headers)) {
    if (key.toLowerCase() !== wanted) continue;
    const text = typeof value === 'string' ? value : value?.[0];
    if (text !== undefined) return text.trim();
  }
  return undefined;
}

/** `TRACE_ID/SPAN_ID;o=1`: the span ID is an unsigned 64-bit decimal; `o=1` means sampled. */
export function parseCloudTraceContext(text: string | undefined): IncomingTrace | null {
  const match = text === undefined ? null : CLOUD_TRACE.exec(text);
  if (!match) return null;
  const [, traceText = '', spanText, options] = match;
  const traceId = traceText.toLowerCase();
  if (ZEROS.test(traceId)) return null;
  const sampled = options !== undefined && (Number(options) & 1) === 1;
  if (spanText === undefined) return { traceId, sampled, source: 'x-cloud-trace-context' };
  const span = BigInt(spanText);
  if (span === 0n || span > MAX_SPAN_ID) return null;
  return { traceId, spanId: span.toString(16).padStart(16, '0'), sampled, source: 'x-cloud-trace-context' };
}

/** W3C Trace Context: version `ff` is invalid, version 00 has exactly four fields, IDs are never all zeros. */
export function parseTraceparent(text: string | undefined): IncomingTrace | null {
  const match = text === undefined ? null : TRACEPARENT.exec(text);
  if (!match) return null;
  const [, version = '', traceId = '', spanId = '', flags = '', rest] = match;
  if (version === 'ff' || (version === '00' && rest !== undefined)) return null;
  if (ZEROS.test(traceId) || ZEROS.test(spanId)) return null;
  return { traceId, spanId, sampled: (parseInt(flags, 16) & 1) === 1, source: 'traceparent' };
}

/** The request's trace: `X-Cloud-Trace-Context` first, then `traceparent`; null when neither is valid. */
export function incomingTrace(headers: RequestHeaders | undefined): IncomingTrace | null {
  try {
    return parseCloudTraceContext(header(headers, 'x-cloud-trace-context')) ?? parseTraceparent(header(headers, 'traceparent'));
  } catch {
    return null;
  }
}

/** The remote parent a step span joins, when the request named a span. */
export function remoteSpanContext(trace: IncomingTrace | null): SpanContext | null {
  if (trace?.spanId === undefined) return null;
  return { traceId: trace.traceId, spanId: trace.spanId, traceFlags: trace.sampled ? TraceFlags.SAMPLED : TraceFlags.NONE, isRemote: true };
}

/** The `traceparent` header naming a span, for a request this one makes (W3C, version 00). */
export function traceparentOf(context: SpanContext): string {
  return `00-${context.traceId}-${context.spanId}-${(context.traceFlags & TraceFlags.SAMPLED) !== 0 ? '01' : '00'}`;
}
