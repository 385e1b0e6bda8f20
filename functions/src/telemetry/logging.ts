/**
 * Structured log lines in the shape Cloud Logging reads from a function's stdout and stderr: one
 * JSON object per line with `severity` and `message`, the step's fields (jobId, step, unit, epoch,
 * phase, whichever are known) and the trace it belongs to (`logging.googleapis.com/trace` as
 * `projects/<project>/traces/<traceId>`, with `logging.googleapis.com/spanId` and
 * `logging.googleapis.com/trace_sampled`), so the log viewer shows a step's lines under its trace
 * and the trace viewer links back to them. A line is also an event on the step's span when that is
 * recorded. Logging never throws.
 */
import { isSpanContextValid, TraceFlags } from '@opentelemetry/api';
import { currentStep, type StepFields, type StepScope } from './scope';

export type Severity = 'DEBUG' | 'INFO' | 'NOTICE' | 'WARNING' | 'ERROR';

export const TRACE_FIELD = 'logging.googleapis.com/trace';
export const SPAN_ID_FIELD = 'logging.googleapis.com/spanId';
export const TRACE_SAMPLED_FIELD = 'logging.googleapis.com/trace_sampled';

export interface LogEntry {
  readonly severity: Severity;
  readonly message: string;
  readonly [field: string]: unknown;
}

/** Where entries go: a JSON line on stdout (jsonLineSink) or the platform's logger. */
export type LogSink = (entry: LogEntry) => void;

export type LogDetail = Readonly<Record<string, unknown>>;

/** Plain functions, so they can be handed on alone (`log: logger.warn`). */
export interface StepLogger {
  readonly debug: (message: string, detail?: LogDetail) => void;
  readonly info: (message: string, detail?: LogDetail) => void;
  readonly warn: (message: string, detail?: LogDetail) => void;
  readonly error: (message: string, detail?: LogDetail) => void;
}

const STEP_FIELD_NAMES: readonly (keyof StepFields)[] = ['jobId', 'step', 'unit', 'epoch', 'phase'];
const RESERVED = new Set<string>(['severity', 'message', TRACE_FIELD, SPAN_ID_FIELD, TRACE_SAMPLED_FIELD, ...STEP_FIELD_NAMES]);

/** The trace fields of a line written in `scope`: its span's context, else the request's header; none without a project. */
export function traceFields(scope: StepScope | undefined, project: string | undefined): Record<string, unknown> {
  if (!scope || !project) return {};
  const context = scope.span.spanContext();
  if (isSpanContextValid(context)) {
    return {
      [TRACE_FIELD]: `projects/${project}/traces/${context.traceId}`,
      [SPAN_ID_FIELD]: context.spanId,
      [TRACE_SAMPLED_FIELD]: (context.traceFlags & TraceFlags.SAMPLED) !== 0,
    };
  }
  const incoming = scope.incoming;
  if (!incoming) return {};
  return {
    [TRACE_FIELD]: `projects/${project}/traces/${incoming.traceId}`,
    ...(incoming.spanId === undefined ? {} : { [SPAN_ID_FIELD]: incoming.spanId }),
    [TRACE_SAMPLED_FIELD]: incoming.sampled,
  };
}

/** Errors as their name, message and code (JSON.stringify drops an Error's own fields). */
function plain(value: unknown): unknown {
  if (!(value instanceof Error)) return value;
  const code = (value as { code?: unknown }).code;
  return { name: value.name, message: value.message, ...(code === undefined ? {} : { code }) };
}

/** One entry: severity and message, the caller's detail, the step's fields, the trace fields. The step's fields win over the detail's. */
export function logEntry(severity: Severity, message: string, detail: LogDetail = {}, scope: StepScope | undefined = currentStep(), project?: string): LogEntry {
  const fields: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(detail)) {
    if (!RESERVED.has(key)) fields[key] = plain(value);
    else if (STEP_FIELD_NAMES.includes(key as keyof StepFields)) fields[key] = value;
  }
  const known = scope?.fields ?? {};
  for (const name of STEP_FIELD_NAMES) {
    const value = known[name];
    if (value !== undefined) fields[name] = value;
  }
  return { severity, message, ...fields, ...traceFields(scope, project) };
}

/** JSON text that never throws: cycles become "[Circular]", bigints strings. */
export function safeJson(entry: LogEntry): string {
  const seen = new WeakSet<object>();
  try {
    return JSON.stringify(entry, (_key, value: unknown) => {
      if (typeof value === 'bigint') return value.toString();
      if (value instanceof Error) return plain(value);
      if (value !== null && typeof value === 'object') {
        if (seen.has(value)) return '[Circular]';
        seen.add(value);
      }
      return value;
    });
  } catch (error) {
    return JSON.stringify({ severity: entry.severity, message: entry.message, logError: error instanceof Error ? error.message : String(error) });
  }
}

/** One JSON line per entry: warnings and errors to stderr, the rest to stdout (Cloud Logging reads both). */
export function jsonLineSink(write: (line: string, severity: Severity) => void = defaultWrite): LogSink {
  return (entry) => write(safeJson(entry), entry.severity);
}

function defaultWrite(line: string, severity: Severity): void {
  (severity === 'WARNING' || severity === 'ERROR' ? process.stderr : process.stdout).write(`${line}\n`);
}

export interface StepLoggerOptions {
  /** The Google Cloud project the trace field names; without one, lines carry no trace field. */
  readonly project?: string | undefined;
  readonly sink?: LogSink;
}

/** A logger whose every line carries the current step's fields and trace (see logEntry). */
export function stepLogger(options: StepLoggerOptions = {}): StepLogger {
  const sink = options.sink ?? jsonLineSink();
  const write = (severity: Severity, message: string, detail?: LogDetail): void => {
    try {
      const scope = currentStep();
      sink(logEntry(severity, message, detail, scope, options.project));
      if (scope?.span.isRecording()) scope.span.addEvent(message, { 'log.severity': severity });
    } catch {
      // A log line that cannot be written is lost; the step it describes goes on.
    }
  };
  return {
    debug: (message, detail) => write('DEBUG', message, detail),
    info: (message, detail) => write('INFO', message, detail),
    warn: (message, detail) => write('WARNING', message, detail),
    error: (message, detail) => write('ERROR', message, detail),
  };
}
