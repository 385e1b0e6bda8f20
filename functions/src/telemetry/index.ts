/**
 * Traces and structured logs of steps (see the README's "Traces and logs"): a step's scope and span
 * (step.ts), spans of the engine's Firestore commits (commits.ts, called by the store), log lines
 * with the step's fields and trace (logging.ts), and the exporter configuration (tracing.ts). The
 * spans of model and tool calls wrap the agent's ports, so they live with them (agent/traced.ts).
 * telemetry/ sits just above core/: nothing here imports Firebase or the code it observes; the
 * triggers connect it to the platform.
 */
export { COMMIT_ATTRIBUTES, jobCommitKind, noteCommitPreconditionFailed, noteJobCommit, noteUnitCommit, traceCommit, unitCommitKind } from './commits';
export { jsonLineSink, logEntry, stepLogger, SPAN_ID_FIELD, TRACE_FIELD, TRACE_SAMPLED_FIELD, type LogEntry, type LogSink, type Severity, type StepLogger } from './logging';
export { annotateStep, currentStep, STEP_ATTRIBUTES, TRACER_NAME, type StepFields } from './scope';
export { OUTCOME_ATTRIBUTE } from './spans';
export { taskFields, traceStep, type StepTraceOptions } from './step';
export { incomingTrace, parseCloudTraceContext, parseTraceparent, traceparentOf, type IncomingTrace, type RequestHeaders } from './trace-headers';
export { NO_TRACING, startTracing, TRACE_EXPORTERS, type Tracing, type TracingConfig, type TracingOptions } from './tracing';
