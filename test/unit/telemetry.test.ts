/**
 * Traces and structured logs (functions/src/telemetry): a step's span joins the trace its request
 * names (traceparent or X-Cloud-Trace-Context), model calls, tool calls and commits are its
 * children with the step's job, step, unit, epoch and phase, log lines carry the same fields and
 * Cloud Logging's trace field, and a malformed header is ignored. Spans are read from an in-memory
 * exporter on a provider of the test's own (no global state).
 */
import { SpanStatusCode, trace } from '@opentelemetry/api';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { ProviderRateLimitedError, type ChatRequest, type ChatResponse, type ModelProvider, type ToolCall } from '../../functions/src/agent/provider';
import type { Toolbox } from '../../functions/src/agent/tools';
import { ConfigurationError, DECLARED_VARIABLES, tracingConfigFromEnv } from '../../functions/src/config/environment';
import { ManualClock } from '../../functions/src/core/clock';
import { createMemoryArtifactStore } from '../../functions/src/agent/web/artifacts';
import { configuredProvider } from '../../functions/src/pipelines/providers';
import {
  incomingTrace,
  jobCommitKind,
  logEntry,
  noteCommitPreconditionFailed,
  noteJobCommit,
  noteUnitCommit,
  parseCloudTraceContext,
  parseTraceparent,
  startTracing,
  stepLogger,
  traceCommit,
  traceStep,
  unitCommitKind,
  type LogEntry,
} from '../../functions/src/telemetry';
import { jsonLineSink, safeJson } from '../../functions/src/telemetry/logging';
import { tracedProvider, tracedToolbox } from '../../functions/src/agent/traced';

const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736';
const PARENT_SPAN = '00f067aa0ba902b7';
const TRACEPARENT = `00-${TRACE_ID}-${PARENT_SPAN}-01`;
/** The same parent span in Google's header: its span ID in decimal. */
const CLOUD_TRACE = `${TRACE_ID.toUpperCase()}/${BigInt(`0x${PARENT_SPAN}`).toString(10)};o=1`;
const PROJECT = 'demo-phaseline';

let exporter: InMemorySpanExporter;
let provider: BasicTracerProvider;
const tracer = () => provider.getTracer('test');

beforeEach(() => {
  exporter = new InMemorySpanExporter();
  provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
});
afterEach(() => provider.shutdown());

const spans = (): ReadableSpan[] => exporter.getFinishedSpans();
const spanNamed = (name: string): ReadableSpan => {
  const found = spans().filter((span) => span.name === name);
  if (found.length !== 1) throw new Error(`expected one span ${name}, got ${found.length} among ${spans().map((span) => span.name).join(', ')}`);
  return found[0]!;
};

const signal = new AbortController().signal;

/** A model that answers with one tool call, at a price. */
const fakeModel: ModelProvider = {
  name: 'fake-model',
  contextWindowTokens: 1000,
  chat: (): Promise<ChatResponse> =>
    Promise.resolve({
      message: { role: 'assistant', content: null, toolCalls: [{ id: 'call-1', name: 'search', arguments: '{"query":"leases"}' }] },
      finishReason: 'tool_calls',
      usage: { inputTokens: 120, outputTokens: 30 },
      costUsd: 0.0015,
    }),
};

const fakeTools: Toolbox = {
  specs: [{ name: 'search', description: 'search', parameters: { type: 'object' } }],
  execute: (call: ToolCall) => Promise.resolve(call.name === 'search' ? { ok: true, content: 'three hits', sources: [] } : { ok: false, content: '{"error":"no such tool"}' }),
};

const request: ChatRequest = { messages: [{ role: 'user', content: 'How do leases work?' }], tools: fakeTools.specs, signal };

const queuedJob = { id: 'job-1', status: 'queued', epoch: 3, phase: 'outline' };
const claimedJob = { ...queuedJob, status: 'running', epoch: 4 };
const handedOff = { ...claimedJob, status: 'queued', phase: 'perspectives' };

/** A job step as the engine makes it: claim, a model call, a tool call, a transcript save refused once, a hand-off; with log lines. */
async function jobStep(logged: LogEntry[], headers: Record<string, string> | undefined, options: { tracer?: boolean } = {}) {
  const log = stepLogger({ project: PROJECT, sink: (entry) => logged.push(entry) });
  const model = tracedProvider(fakeModel);
  const tools = tracedToolbox(fakeTools);
  return traceStep(
    { headers, task: { jobId: 'job-1', step: 2 }, ...(options.tracer === false ? {} : { tracer: tracer() }) },
    async () => {
      log.info('step started');
      await traceCommit('job job-1', () => {
        noteJobCommit(queuedJob, claimedJob, [{ kind: 'claimed' }]);
        return Promise.resolve();
      });
      const answer = await model.chat(request);
      await tools.execute(answer.message.toolCalls![0]!, signal);
      await traceCommit('transcript s1 for job job-1', () => {
        noteCommitPreconditionFailed();
        return Promise.resolve();
      });
      await traceCommit('job job-1', () => {
        noteJobCommit(claimedJob, handedOff, [{ kind: 'checkpointed' }]);
        return Promise.resolve();
      });
      log.warn('progress write failed; kept for the next flush', { error: new Error('deadline exceeded') });
      return { kind: 'handed-off' as const };
    },
    (outcome) => ({ 'phaseline.outcome': outcome.kind }),
  );
}

describe('the trace a request names', () => {
  test('traceparent: trace, span and sampled flag', () => {
    expect(parseTraceparent(TRACEPARENT)).toEqual({ traceId: TRACE_ID, spanId: PARENT_SPAN, sampled: true, source: 'traceparent' });
    expect(parseTraceparent(`00-${TRACE_ID}-${PARENT_SPAN}-00`)?.sampled).toBe(false);
    // A later version may add fields; version 00 may not.
    expect(parseTraceparent(`01-${TRACE_ID}-${PARENT_SPAN}-01-more`)?.spanId).toBe(PARENT_SPAN);
  });

  test('X-Cloud-Trace-Context: the decimal span ID as 16 hex digits, o=1 sampled, any header casing', () => {
    expect(parseCloudTraceContext(CLOUD_TRACE)).toEqual({ traceId: TRACE_ID, spanId: PARENT_SPAN, sampled: true, source: 'x-cloud-trace-context' });
    expect(parseCloudTraceContext(`${TRACE_ID}/18446744073709551615;o=0`)).toEqual({ traceId: TRACE_ID, spanId: 'ffffffffffffffff', sampled: false, source: 'x-cloud-trace-context' });
    expect(incomingTrace({ 'X-Cloud-Trace-Context': CLOUD_TRACE })?.spanId).toBe(PARENT_SPAN);
    // A trace without a span still names the trace for log lines.
    expect(parseCloudTraceContext(TRACE_ID)).toEqual({ traceId: TRACE_ID, sampled: false, source: 'x-cloud-trace-context' });
  });

  test("both headers: Google's wins (the trace of Cloud Run's request log)", () => {
    const other = `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`;
    expect(incomingTrace({ traceparent: other, 'x-cloud-trace-context': CLOUD_TRACE })?.traceId).toBe(TRACE_ID);
    // A malformed Google header falls back to a valid traceparent.
    expect(incomingTrace({ traceparent: TRACEPARENT, 'x-cloud-trace-context': 'nonsense' })?.source).toBe('traceparent');
  });

  test.each([
    ['garbage', { traceparent: 'not a trace' }],
    ['version ff', { traceparent: `ff-${TRACE_ID}-${PARENT_SPAN}-01` }],
    ['version 00 with a fifth field', { traceparent: `00-${TRACE_ID}-${PARENT_SPAN}-01-extra` }],
    ['upper-case traceparent', { traceparent: TRACEPARENT.toUpperCase() }],
    ['all-zero trace ID', { traceparent: `00-${'0'.repeat(32)}-${PARENT_SPAN}-01` }],
    ['all-zero span ID', { traceparent: `00-${TRACE_ID}-${'0'.repeat(16)}-01` }],
    ['short trace ID', { 'x-cloud-trace-context': `${TRACE_ID.slice(1)}/1;o=1` }],
    ['span ID past 64 bits', { 'x-cloud-trace-context': `${TRACE_ID}/18446744073709551616;o=1` }],
    ['span ID zero', { 'x-cloud-trace-context': `${TRACE_ID}/0;o=1` }],
    ['span ID not a number', { 'x-cloud-trace-context': `${TRACE_ID}/12ab;o=1` }],
    ['empty', { traceparent: '', 'x-cloud-trace-context': '' }],
  ])('a malformed header is no trace: %s', (_case, headers) => {
    expect(incomingTrace(headers)).toBeNull();
  });

  test('absent or odd headers are no trace', () => {
    expect(incomingTrace(undefined)).toBeNull();
    expect(incomingTrace({})).toBeNull();
    expect(incomingTrace({ traceparent: [TRACEPARENT] })?.traceId).toBe(TRACE_ID);
  });
});

describe("a step's spans", () => {
  test('the step span joins the incoming traceparent; model call, tool call and commits are its children with job, step, epoch and phase', async () => {
    const outcome = await jobStep([], { traceparent: TRACEPARENT });
    expect(outcome).toEqual({ kind: 'handed-off' });

    const step = spanNamed('job-step');
    expect(step.spanContext().traceId).toBe(TRACE_ID);
    expect(step.parentSpanContext?.spanId).toBe(PARENT_SPAN);
    expect(step.parentSpanContext?.isRemote).toBe(true);
    expect(step.attributes).toMatchObject({ 'phaseline.job_id': 'job-1', 'phaseline.step': 2, 'phaseline.epoch': 4, 'phaseline.phase': 'outline', 'phaseline.outcome': 'handed-off' });

    const children = spans().filter((span) => span !== step);
    expect(children.map((span) => span.name)).toEqual(['commit claim', 'chat fake-model', 'execute_tool search', 'commit transcript', 'commit hand-off']);
    for (const child of children) {
      expect(child.spanContext().traceId).toBe(TRACE_ID);
      expect(child.parentSpanContext?.spanId).toBe(step.spanContext().spanId);
      // The claim's own commit tells the step its epoch: every span from it on carries it.
      expect(child.attributes).toMatchObject({ 'phaseline.job_id': 'job-1', 'phaseline.step': 2, 'phaseline.epoch': 4, 'phaseline.phase': 'outline' });
    }

    expect(spanNamed('chat fake-model').attributes).toMatchObject({
      'gen_ai.operation.name': 'chat',
      'gen_ai.provider.name': 'fake-model',
      'gen_ai.usage.input_tokens': 120,
      'gen_ai.usage.output_tokens': 30,
      'phaseline.model.cost_usd': 0.0015,
      'phaseline.model.tool_calls': 1,
      'phaseline.outcome': 'ok',
    });
    expect(spanNamed('execute_tool search').attributes).toMatchObject({ 'gen_ai.tool.name': 'search', 'gen_ai.tool.call.id': 'call-1', 'phaseline.outcome': 'ok' });
    expect(spanNamed('commit transcript').attributes).toMatchObject({ 'phaseline.commit.kind': 'transcript', 'phaseline.commit.precondition_failures': 1, 'phaseline.outcome': 'ok' });
    expect(spanNamed('commit claim').attributes).toMatchObject({ 'phaseline.commit.kind': 'claim', 'phaseline.commit.precondition_failures': 0 });
  });

  test('X-Cloud-Trace-Context parents the step span the same way', async () => {
    await jobStep([], { 'X-Cloud-Trace-Context': CLOUD_TRACE });
    const step = spanNamed('job-step');
    expect(step.spanContext().traceId).toBe(TRACE_ID);
    expect(step.parentSpanContext?.spanId).toBe(PARENT_SPAN);
  });

  test('a malformed header is ignored: the step runs as a new trace, nothing throws', async () => {
    await expect(jobStep([], { traceparent: 'zz-garbage', 'x-cloud-trace-context': `${TRACE_ID}/12ab;o=1` })).resolves.toEqual({ kind: 'handed-off' });
    const step = spanNamed('job-step');
    expect(step.parentSpanContext).toBeUndefined();
    expect(step.spanContext().traceId).not.toBe(TRACE_ID);
    expect(spans()).toHaveLength(6);
  });

  test('a unit step names its unit; the unit claim gives it its epoch', async () => {
    await traceStep({ task: { jobId: 'job-1', step: 5, unit: 'expert-2', phase: 'expert-content' }, tracer: tracer() }, async () => {
      await traceCommit('unit claim job-1/expert-content/expert-2', () => {
        const unit = { jobId: 'job-1', unit: 'expert-2', phase: 'expert-content', status: 'queued', epoch: 1 };
        noteUnitCommit(unit, { ...unit, status: 'running', epoch: 2 });
        return Promise.resolve();
      });
      await tracedProvider(fakeModel).chat(request);
    });
    const model = spanNamed('chat fake-model');
    expect(model.attributes).toMatchObject({ 'phaseline.unit': 'expert-2', 'phaseline.phase': 'expert-content', 'phaseline.epoch': 2, 'phaseline.step': 5 });
    expect(spanNamed('commit unit-claim').parentSpanContext?.spanId).toBe(spanNamed('unit-step').spanContext().spanId);
  });

  test('a failed model call: the error passes through unchanged, the span is an error with its code', async () => {
    const refused = new ProviderRateLimitedError('slow down', 2_000);
    const failing: ModelProvider = { ...fakeModel, chat: () => Promise.reject(refused) };
    await traceStep({ task: { jobId: 'job-1', step: 0 }, tracer: tracer() }, async () => {
      await expect(tracedProvider(failing).chat(request)).rejects.toBe(refused);
    });
    const span = spanNamed('chat fake-model');
    expect(span.status.code).toBe(SpanStatusCode.ERROR);
    expect(span.attributes['phaseline.outcome']).toBe('rate_limited');
    expect(span.events.map((event) => event.name)).toContain('exception');
  });

  test("a tool's failure the model reads is outcome tool-error; a commit that lost its claim says so", async () => {
    const lost = Object.assign(new Error('Claim epoch 4 no longer owns job job-1'), { code: 'ownership_lost' });
    await traceStep({ task: { jobId: 'job-1', step: 0 }, tracer: tracer() }, async () => {
      await tracedToolbox(fakeTools).execute({ id: 'c2', name: 'nope', arguments: '{}' }, signal);
      await expect(traceCommit('section s2 for job job-1', () => Promise.reject(lost))).rejects.toBe(lost);
    });
    expect(spanNamed('execute_tool nope').attributes['phaseline.outcome']).toBe('tool-error');
    expect(spanNamed('commit section').attributes).toMatchObject({ 'phaseline.outcome': 'ownership_lost', 'phaseline.commit.kind': 'section' });
  });

  test('a commit inside a commit (the store retrying a claim-slot write) is one span', async () => {
    await traceStep({ task: { jobId: 'job-1', step: 0 }, tracer: tracer() }, () => traceCommit('heartbeat for unit job-1/u', () => traceCommit('heartbeat for unit job-1/u', () => Promise.resolve())));
    expect(spans().map((span) => span.name)).toEqual(['commit heartbeat', 'job-step']);
  });

  test('a step that throws: the span records it, the error is rethrown as it was', async () => {
    const boom = new Error('boom');
    await expect(traceStep({ task: { jobId: 'job-1', step: 0 }, tracer: tracer() }, () => Promise.reject(boom))).rejects.toBe(boom);
    expect(spanNamed('job-step').status.code).toBe(SpanStatusCode.ERROR);
  });

  test('a toolbox bound to a job is traced too; the provider keeps its name and window', async () => {
    const bound: Toolbox = { ...fakeTools, forJob: () => fakeTools };
    const traced = tracedToolbox(bound);
    await traceStep({ task: { jobId: 'job-1', step: 0 }, tracer: tracer() }, () => traced.forJob!('job-1').execute({ id: 'c3', name: 'search', arguments: '{}' }, signal));
    expect(spanNamed('execute_tool search').attributes['phaseline.job_id']).toBe('job-1');
    expect('forJob' in tracedToolbox(fakeTools)).toBe(false);
    const model = tracedProvider(fakeModel);
    expect([model.name, model.contextWindowTokens]).toEqual(['fake-model', 1000]);
  });

  test('the configured provider and tools (as the deployed pipelines get them) make spans', async () => {
    const { provider: model, toolbox } = configuredProvider(new ManualClock(), {}, { artifacts: createMemoryArtifactStore() });
    await traceStep({ task: { jobId: 'job-9', step: 1 }, tracer: tracer() }, async () => {
      await toolbox.execute({ id: 'c4', name: 'search', arguments: JSON.stringify({ query: 'fencing tokens' }) }, signal);
      await model.chat({ messages: [{ role: 'user', content: 'Write one paragraph about fencing tokens.' }], tools: [], signal });
    });
    expect(spanNamed('execute_tool search').attributes['phaseline.job_id']).toBe('job-9');
    expect(spanNamed('chat offline').attributes).toMatchObject({ 'phaseline.job_id': 'job-9', 'phaseline.outcome': 'ok' });
  });
});

describe('commit kinds', () => {
  test('from the records and events a commit writes', () => {
    expect(jobCommitKind(queuedJob, claimedJob, [{ kind: 'claimed' }])).toBe('claim');
    expect(jobCommitKind(claimedJob, { ...claimedJob, epoch: 5 }, [{ kind: 'reclaimed' }, { kind: 'claimed' }])).toBe('take-over');
    expect(jobCommitKind(claimedJob, claimedJob, [])).toBe('heartbeat');
    expect(jobCommitKind(claimedJob, handedOff, [{ kind: 'checkpointed' }])).toBe('hand-off');
    expect(jobCommitKind(claimedJob, handedOff, [{ kind: 'yielded' }])).toBe('hand-off');
    expect(jobCommitKind(claimedJob, handedOff, [{ kind: 'retrying' }])).toBe('retry');
    expect(jobCommitKind(claimedJob, { ...claimedJob, status: 'completed' }, [{ kind: 'completed' }])).toBe('completed');
    expect(jobCommitKind(claimedJob, claimedJob, [{ kind: 'fanned-out' }])).toBe('fanned-out');
    expect(unitCommitKind({ status: 'queued', epoch: 0 }, { status: 'running', epoch: 1 })).toBe('unit-claim');
    expect(unitCommitKind({ status: 'running', epoch: 1 }, { status: 'running', epoch: 1 })).toBe('unit-heartbeat');
    expect(unitCommitKind({ status: 'running', epoch: 1 }, { status: 'done', epoch: 1 })).toBe('unit-done');
  });
});

describe("a step's log lines", () => {
  const traceField = 'logging.googleapis.com/trace';
  const spanField = 'logging.googleapis.com/spanId';

  test('carry severity, message, job, step, epoch, phase and the trace of a traceparent request', async () => {
    const logged: LogEntry[] = [];
    await jobStep(logged, { traceparent: TRACEPARENT });
    const step = spanNamed('job-step');
    expect(logged).toHaveLength(2);
    expect(logged[0]).toEqual({
      severity: 'INFO',
      message: 'step started',
      jobId: 'job-1',
      step: 2,
      [traceField]: `projects/${PROJECT}/traces/${TRACE_ID}`,
      [spanField]: step.spanContext().spanId,
      'logging.googleapis.com/trace_sampled': true,
    });
    // After the claim: its epoch and phase too; an Error in the detail is kept readable.
    expect(logged[1]).toMatchObject({ severity: 'WARNING', jobId: 'job-1', step: 2, epoch: 4, phase: 'outline', [traceField]: `projects/${PROJECT}/traces/${TRACE_ID}` });
    expect(logged[1]!.error).toEqual({ name: 'Error', message: 'deadline exceeded' });
    // Each line is also an event on the step's span.
    expect(step.events.map((event) => event.name)).toEqual(['step started', 'progress write failed; kept for the next flush']);
  });

  test('carry the trace of an X-Cloud-Trace-Context request', async () => {
    const logged: LogEntry[] = [];
    await jobStep(logged, { 'x-cloud-trace-context': CLOUD_TRACE });
    expect(logged.map((entry) => entry[traceField])).toEqual([`projects/${PROJECT}/traces/${TRACE_ID}`, `projects/${PROJECT}/traces/${TRACE_ID}`]);
  });

  test('with no exporter configured (the no-op tracer), still carry the request trace and its span', async () => {
    const logged: LogEntry[] = [];
    await jobStep(logged, { 'x-cloud-trace-context': CLOUD_TRACE }, { tracer: false });
    expect(spans()).toEqual([]);
    expect(logged[1]).toMatchObject({ jobId: 'job-1', epoch: 4, phase: 'outline', [traceField]: `projects/${PROJECT}/traces/${TRACE_ID}`, [spanField]: PARENT_SPAN });
  });

  test('a malformed header: no trace field, nothing thrown, the step fields still there', async () => {
    const logged: LogEntry[] = [];
    await expect(jobStep(logged, { traceparent: '00-xyz', 'x-cloud-trace-context': 'abc/def' }, { tracer: false })).resolves.toEqual({ kind: 'handed-off' });
    expect(logged.map((entry) => entry[traceField])).toEqual([undefined, undefined]);
    expect(logged[1]).toMatchObject({ jobId: 'job-1', step: 2, epoch: 4 });
  });

  test("the step's fields win over a detail's; reserved fields cannot be overwritten", async () => {
    const logged: LogEntry[] = [];
    const log = stepLogger({ project: PROJECT, sink: (entry) => logged.push(entry) });
    await traceStep({ task: { jobId: 'job-1', step: 2 }, headers: { traceparent: TRACEPARENT }, tracer: tracer() }, () => {
      log.info('hello', { jobId: 'other', severity: 'DEBUG', message: 'not this', [traceField]: 'forged', extra: 1 });
      return Promise.resolve();
    });
    expect(logged[0]).toMatchObject({ severity: 'INFO', message: 'hello', jobId: 'job-1', extra: 1, [traceField]: `projects/${PROJECT}/traces/${TRACE_ID}` });
    // Outside a step a detail's job ID stays (the sweeper names the jobs it acts on).
    expect(logEntry('INFO', 'swept', { jobId: 'job-7' }, undefined, PROJECT)).toEqual({ severity: 'INFO', message: 'swept', jobId: 'job-7' });
  });

  test('logging never throws: a failing sink, a circular detail, a bigint', () => {
    const throwing = stepLogger({ sink: () => { throw new Error('stdout closed'); } });
    expect(() => throwing.error('x')).not.toThrow();
    const circular: Record<string, unknown> = { big: 10n };
    circular.self = circular;
    const lines: string[] = [];
    jsonLineSink((line) => lines.push(line))({ severity: 'INFO', message: 'm', circular });
    expect(JSON.parse(lines[0]!)).toEqual({ severity: 'INFO', message: 'm', circular: { big: '10', self: '[Circular]' } });
    expect(JSON.parse(safeJson({ severity: 'ERROR', message: 'e', error: new TypeError('bad') }))).toEqual({ severity: 'ERROR', message: 'e', error: { name: 'TypeError', message: 'bad' } });
  });
});

describe('exporting', () => {
  test('PHASELINE_TRACE_EXPORTER: none by default; console and otlp with their settings; a bad value named', () => {
    expect(tracingConfigFromEnv({})).toEqual({ exporter: 'none' });
    // The other variables are read only when spans are exported.
    expect(tracingConfigFromEnv({ PHASELINE_TRACE_SAMPLE_RATIO: 'lots', PHASELINE_TRACE_OTLP_URL: 'nope' })).toEqual({ exporter: 'none' });
    expect(tracingConfigFromEnv({ PHASELINE_TRACE_EXPORTER: 'console' })).toEqual({ exporter: 'console', sampleRatio: 1 });
    expect(tracingConfigFromEnv({ PHASELINE_TRACE_EXPORTER: 'otlp', PHASELINE_TRACE_OTLP_URL: 'http://collector:4318/v1/traces', PHASELINE_TRACE_SAMPLE_RATIO: '0.25' })).toEqual({
      exporter: 'otlp',
      url: 'http://collector:4318/v1/traces',
      sampleRatio: 0.25,
    });
    expect(() => tracingConfigFromEnv({ PHASELINE_TRACE_EXPORTER: 'jaeger' })).toThrow(ConfigurationError);
    expect(() => tracingConfigFromEnv({ PHASELINE_TRACE_EXPORTER: 'jaeger' })).toThrow(/PHASELINE_TRACE_EXPORTER must be none, console, otlp/);
    expect(() => tracingConfigFromEnv({ PHASELINE_TRACE_EXPORTER: 'console', PHASELINE_TRACE_SAMPLE_RATIO: '2' })).toThrow(/PHASELINE_TRACE_SAMPLE_RATIO must be at most 1/);
  });

  test('the declared defaults are what parsing an empty environment gives', () => {
    const otlp = tracingConfigFromEnv({ PHASELINE_TRACE_EXPORTER: 'otlp' });
    if (otlp.exporter !== 'otlp') throw new Error('expected otlp');
    const parsed: Record<string, string> = {
      PHASELINE_TRACE_EXPORTER: tracingConfigFromEnv({}).exporter,
      PHASELINE_TRACE_OTLP_URL: otlp.url,
      PHASELINE_TRACE_SAMPLE_RATIO: String(otlp.sampleRatio),
    };
    const declared = DECLARED_VARIABLES.filter((variable) => variable.name.startsWith('PHASELINE_TRACE_'));
    expect(Object.fromEntries(declared.map((variable) => [variable.name, variable.defaultText]))).toEqual(parsed);
  });

  test('none registers nothing: the global tracer stays the no-op one', async () => {
    const tracing = await startTracing({ exporter: 'none' }, { serviceName: 'runJobStep' });
    expect(tracing.exporter).toBe('none');
    const span = trace.getTracer('phaseline').startSpan('x');
    expect(span.isRecording()).toBe(false);
    span.end();
  });

  test('console: one JSON line per span, with the Cloud Logging trace fields', async () => {
    const lines: string[] = [];
    const tracing = await startTracing({ exporter: 'console', sampleRatio: 1 }, { serviceName: 'runJobStep', project: PROJECT, write: (line) => lines.push(line), register: false });
    await traceStep({ headers: { traceparent: TRACEPARENT }, task: { jobId: 'job-1', step: 0 }, tracer: tracing.tracer }, () => Promise.resolve());
    await tracing.flush();
    expect(lines).toHaveLength(1);
    const line = JSON.parse(lines[0]!) as Record<string, unknown> & { span: { name: string; parentSpanId: string; attributes: Record<string, unknown> } };
    expect(line).toMatchObject({ severity: 'DEBUG', 'logging.googleapis.com/trace': `projects/${PROJECT}/traces/${TRACE_ID}` });
    expect(line.span).toMatchObject({ name: 'job-step', parentSpanId: PARENT_SPAN, attributes: { 'phaseline.job_id': 'job-1' } });
    await tracing.shutdown();
  });

  test('the sample ratio decides by trace ID, not by the request header', async () => {
    const lines: string[] = [];
    const none = await startTracing({ exporter: 'console', sampleRatio: 0 }, { serviceName: 'runJobStep', write: (line) => lines.push(line), register: false });
    await traceStep({ headers: { traceparent: TRACEPARENT }, task: {}, tracer: none.tracer }, () => Promise.resolve());
    const all = await startTracing({ exporter: 'console', sampleRatio: 1 }, { serviceName: 'runJobStep', write: (line) => lines.push(line), register: false });
    await traceStep({ headers: { traceparent: `00-${TRACE_ID}-${PARENT_SPAN}-00` }, task: {}, tracer: all.tracer }, () => Promise.resolve());
    expect(lines).toHaveLength(1);
    await Promise.all([none.shutdown(), all.shutdown()]);
  });
});
