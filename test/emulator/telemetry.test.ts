/**
 * Traces of real steps on the Firestore emulator: a research job (offline simulator, corpus tools,
 * ManualClock) run task by task, each task as the step trigger runs it (traceStep with the
 * request's traceparent), spans read from an in-memory exporter. The span tree must explain the
 * job: every step under the trace its request named, every model call, tool call and commit under
 * its step with the job, step, unit, epoch and phase the database holds, and the model spans' cost
 * adding up to the cost the job recorded. The deployed trigger itself is then run through
 * firebase-functions-test with each header form: its log lines and its step span carry the same.
 */
import { trace } from '@opentelemetry/api';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { logger } from 'firebase-functions';
import type { CloudEvent, CloudFunction } from 'firebase-functions/v2';
import type { Request as TaskRequest } from 'firebase-functions/v2/tasks';
import firebaseFunctionsTest from 'firebase-functions-test';
import type { StepTask } from '../../functions/src/core/job';
import { claimJob } from '../../functions/src/core/transitions';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { runStep } from '../../functions/src/engine/step';
import type { StepOutcome } from '../../functions/src/engine/step/deps';
import { runJobStep } from '../../functions/src/index';
import { createResearchPipeline, type ResearchDeps } from '../../functions/src/pipelines/research';
import { createCorpusToolbox, createOfflineProvider } from '../../functions/src/providers/offline';
import { decodeJob, decodeUnit } from '../../functions/src/store/codec';
import { firestoreCircuit } from '../../functions/src/store/provider-circuit';
import { JOB_CLAIM_SLOT, JOBS } from '../../functions/src/store/paths';
import { provideBackends } from '../../functions/src/triggers/admin';
import { stepLogger, tracedProvider, tracedToolbox, traceStep, type LogEntry } from '../../functions/src/telemetry';
import { engineHarness, type EngineHarness } from '../support/engine';
import { immediateTimers } from '../support/research';

const TRACE_ID = '0af7651916cd43dd8448eb211c80319c';
const PROJECT = 'demo-telemetry';

let exporter: InMemorySpanExporter;
let provider: BasicTracerProvider;
let harness: EngineHarness;

beforeAll(() => {
  exporter = new InMemorySpanExporter();
  provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  harness = engineHarness('telemetry', (firestore, clock) => {
    const model = createOfflineProvider({ seed: 11, settings: { inputUsdPer1kTokens: 0.005, outputUsdPer1kTokens: 0.015 }, clock, sleep: () => Promise.resolve() });
    const deps: ResearchDeps = {
      // As the deployed pipelines get them (pipelines/providers.ts): wrapped for tracing.
      provider: tracedProvider(model),
      toolbox: tracedToolbox(createCorpusToolbox({ settings: {}, seed: 11 })),
      circuit: firestoreCircuit(firestore.db, model.name, { failureThreshold: 3, windowMs: 60_000, coolDownMs: 60_000 }),
      policy: { transientRetries: 1, transientMinDelayMs: 1, transientMaxDelayMs: 5 },
      timers: immediateTimers,
    };
    return pipelineRegistry(createResearchPipeline(() => deps));
  });
});
beforeEach(async () => {
  exporter.reset();
  harness.queue.drain();
  await harness.firestore.reset();
});
afterAll(async () => {
  await provider.shutdown();
  await harness.firestore.close();
});

const db = () => harness.firestore.db;
const question = { question: 'How do leases and fencing tokens keep stale workers from corrupting results?', experts: 2, sections: 2, wordsPerSection: 60 };

interface Delivered {
  readonly task: StepTask;
  readonly parentSpanId: string;
  readonly outcome: StepOutcome;
}

/** Runs every queued task as the trigger does: in a step span under a traceparent of its own, logging through the step logger. */
async function drainTraced(logged: LogEntry[]): Promise<Delivered[]> {
  const log = stepLogger({ project: PROJECT, sink: (entry) => logged.push(entry) });
  const delivered: Delivered[] = [];
  for (let round = 0; round < 100; round += 1) {
    const next = harness.queue.tasks.shift();
    if (!next) return delivered;
    harness.clock.advance(next.delaySeconds * 1000);
    const parentSpanId = (round + 1).toString(16).padStart(16, '0');
    const outcome = await traceStep(
      { headers: { traceparent: `00-${TRACE_ID}-${parentSpanId}-01` }, task: next.task, tracer: provider.getTracer('test') },
      async () => {
        const finished = await runStep(harness.deps('worker-t', { log: log.warn }), next.task);
        log.info('step finished', { outcome: finished });
        return finished;
      },
      (finished) => ({ 'phaseline.outcome': finished.kind }),
    );
    delivered.push({ task: next.task, parentSpanId, outcome });
  }
  throw new Error('queue never emptied');
}

const isStep = (span: ReadableSpan): boolean => span.name === 'job-step' || span.name === 'unit-step';
const spanId = (span: ReadableSpan): string => span.spanContext().spanId;
const childrenOf = (spans: readonly ReadableSpan[], parent: ReadableSpan): ReadableSpan[] => spans.filter((span) => span.parentSpanContext?.spanId === spanId(parent));
const names = (spans: readonly ReadableSpan[]): string[] => [...new Set(spans.map((span) => span.name))].sort();

test("a research job's trace: each step under its request's span, its model calls, tool calls and commits under it with the job, step, unit, epoch and phase the database holds", async () => {
  const jobId = await harness.submit('research', question);
  const logged: LogEntry[] = [];
  const delivered = await drainTraced(logged);
  const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  expect(job.status).toBe('completed');

  const spans = exporter.getFinishedSpans();
  const steps = spans.filter(isStep);
  expect(steps).toHaveLength(delivered.length);
  // Every step span is a child of the span its request named, in the request's trace.
  expect(steps.map((step) => step.parentSpanContext?.spanId).sort()).toEqual(delivered.map((task) => task.parentSpanId).sort());
  for (const span of spans) expect(span.spanContext().traceId).toBe(TRACE_ID);
  // Every other span hangs under a step: nothing orphaned, nothing nested elsewhere.
  const stepIds = new Set(steps.map(spanId));
  for (const span of spans.filter((candidate) => !isStep(candidate))) expect(stepIds.has(span.parentSpanContext?.spanId ?? '')).toBe(true);

  for (const { task, parentSpanId, outcome } of delivered) {
    const step = steps.find((candidate) => candidate.parentSpanContext?.spanId === parentSpanId)!;
    const children = childrenOf(spans, step);
    const expected: Record<string, unknown> = { 'phaseline.job_id': jobId, 'phaseline.step': task.step };
    if (task.unit !== undefined) {
      // The unit's epoch as the database holds it, and the phase the task named.
      const ref = harness.store.unitRef(jobId, task.phase!, task.unit);
      const unit = decodeUnit(ref.path, (await ref.get()).data());
      Object.assign(expected, { 'phaseline.unit': task.unit, 'phaseline.phase': task.phase, 'phaseline.epoch': unit.epoch });
      expect(names(children)).toEqual(expect.arrayContaining(['chat offline', 'commit section', 'commit transcript', 'commit unit-claim']));
      expect(children.some((span) => span.name.startsWith('execute_tool '))).toBe(true);
    } else if (outcome.kind === 'handed-off') {
      // The job's epoch: one claim per job step, numbered from 1 in delivery order.
      const epoch = delivered.filter((other) => other.task.unit === undefined).findIndex((other) => other.parentSpanId === parentSpanId) + 1;
      Object.assign(expected, { 'phaseline.phase': outcome.phase, 'phaseline.epoch': epoch });
      expect(names(children)).toEqual(expect.arrayContaining(['chat offline', 'commit claim', 'commit hand-off', 'commit transcript']));
    }
    expect(step.attributes).toMatchObject({ ...expected, 'phaseline.outcome': outcome.kind });
    for (const child of children.filter((span) => span.name !== 'commit claim' && span.name !== 'commit unit-claim')) expect([child.name, child.attributes]).toEqual([child.name, expect.objectContaining(expected)]);
  }
  const handOffs = steps.filter((step) => step.attributes['phaseline.outcome'] === 'handed-off');
  expect(handOffs.length).toBeGreaterThanOrEqual(2);

  // The trace accounts for the job: its model calls, tool calls, tokens and cost are the spans'.
  const models = spans.filter((span) => span.name === 'chat offline');
  const sum = (key: string) => models.reduce((total, span) => total + Number(span.attributes[key]), 0);
  expect(models).toHaveLength(job.cost.modelCalls ?? -1);
  expect(spans.filter((span) => span.name.startsWith('execute_tool '))).toHaveLength(job.cost.toolCalls ?? -1);
  expect(sum('gen_ai.usage.input_tokens')).toBe(job.cost.inputTokens);
  expect(sum('gen_ai.usage.output_tokens')).toBe(job.cost.outputTokens);
  expect(sum('phaseline.model.cost_usd')).toBeCloseTo(job.cost.spentUsd ?? -1, 9);
  // Commits carry their outcome and precondition failures.
  for (const commit of spans.filter((span) => span.name.startsWith('commit '))) {
    expect(commit.attributes).toMatchObject({ 'db.system.name': 'firestore', 'phaseline.outcome': 'ok', 'phaseline.commit.precondition_failures': 0 });
  }

  // Each step's "step finished" line carries its fields and the trace field with the step span's ID.
  expect(logged).toHaveLength(delivered.length);
  for (const [index, entry] of logged.entries()) {
    const { task, parentSpanId } = delivered[index]!;
    const step = steps.find((candidate) => candidate.parentSpanContext?.spanId === parentSpanId)!;
    expect(entry).toMatchObject({
      severity: 'INFO',
      message: 'step finished',
      jobId,
      step: task.step,
      epoch: step.attributes['phaseline.epoch'],
      phase: step.attributes['phaseline.phase'],
      'logging.googleapis.com/trace': `projects/${PROJECT}/traces/${TRACE_ID}`,
      'logging.googleapis.com/spanId': spanId(step),
    });
    if (task.unit !== undefined) expect(entry.unit).toBe(task.unit);
  }
});

test('a commit refused by its update-time precondition says so: a job commit and a claim-slot commit, each after a foreign write', async () => {
  const jobId = await harness.submit('research', question);
  const claim = { jobId, epoch: 1 };
  await traceStep({ task: { jobId, step: 0 }, tracer: provider.getTracer('test') }, async () => {
    const { store } = harness;
    await store.transact(jobId, () => null, ({ job }) => Promise.resolve({ ...claimJob(job, { step: 0, worker: 'worker-t', options: store.options }, harness.clock.now()), value: undefined }));
    // Someone else writes the job (a decision, the sweeper): the holder's remembered update time is stale.
    await store.jobRef(jobId).update({ foreignWrite: true });
    await store.asOwner(claim, ({ job }) => Promise.resolve({ next: job, value: undefined }));

    const session = store.jobSession(claim);
    const note = db().doc(`${JOBS}/${jobId}/telemetryNotes/n`);
    await session.commit('transcript s1', (batch) => batch.set(note, { n: 1 }));
    // A foreign write to the claim slot that leaves it held at our epoch: the next commit is refused, reads, goes on.
    await store.claimSlotRef(jobId, JOB_CLAIM_SLOT).update({ touchedBy: 'someone else' });
    await session.commit('transcript s1', (batch) => batch.set(note, { n: 2 }));
  });
  const commits = exporter.getFinishedSpans().filter((span) => span.name.startsWith('commit '));
  expect(commits.map((span) => [span.name, span.attributes['phaseline.commit.precondition_failures'], span.attributes['phaseline.outcome']])).toEqual([
    ['commit claim', 0, 'ok'],
    ['commit heartbeat', 1, 'ok'],
    ['commit transcript', 0, 'ok'],
    ['commit transcript', 1, 'ok'],
  ]);
  expect((await db().doc(`${JOBS}/${jobId}/telemetryNotes/n`).get()).get('n')).toBe(2);
});

describe('the deployed step trigger', () => {
  const PARENT_SPAN = '00f067aa0ba902b7';
  const functionsTest = firebaseFunctionsTest({ projectId: 'demo-telemetry-trigger' });
  /** The task handler as Cloud Tasks invokes it (firebase-functions-test hands the request to run()). */
  const deliverTask = functionsTest.wrap(runJobStep as unknown as CloudFunction<CloudEvent<unknown>>) as (task: Partial<Omit<TaskRequest<unknown>, 'rawRequest'>>) => Promise<void>;
  let logged: { message: unknown; fields: Record<string, unknown> }[] = [];
  const capture = (message: unknown, fields: unknown): void => {
    logged.push({ message, fields: fields as Record<string, unknown> });
  };

  beforeAll(() => {
    provideBackends({ firestore: db(), queue: harness.queue });
    // No exporter is configured (the default): the test's provider stands in for one, registered globally as startTracing does.
    trace.setGlobalTracerProvider(provider);
    jest.spyOn(logger, 'info').mockImplementation(capture);
    jest.spyOn(logger, 'warn').mockImplementation(capture);
  });
  beforeEach(() => {
    logged = [];
  });
  afterAll(() => {
    jest.restoreAllMocks();
    functionsTest.cleanup();
  });

  async function deliverCanary(headers: Record<string, string>): Promise<{ jobId: string; finished: Record<string, unknown> }> {
    const jobId = await harness.submit('canary', { text: 'One paragraph.\n\nAnother one.' });
    harness.queue.drain();
    await deliverTask({ data: { jobId, step: 0 }, headers, queueName: 'runJobStep', id: 'task-0', retryCount: 0, executionCount: 0 });
    const finished = logged.find((line) => line.message === 'step finished');
    if (!finished) throw new Error(`no "step finished" line among ${logged.map((line) => String(line.message)).join(', ')}`);
    return { jobId, finished: finished.fields };
  }

  test.each([
    ['traceparent', { traceparent: `00-${TRACE_ID}-${PARENT_SPAN}-01` }],
    ['X-Cloud-Trace-Context', { 'x-cloud-trace-context': `${TRACE_ID}/${BigInt(`0x${PARENT_SPAN}`).toString(10)};o=1` }],
  ])("with %s: the step span joins the request's trace and the log line carries the job, step, epoch, phase and trace", async (_form, headers) => {
    const { jobId, finished } = await deliverCanary(headers);
    const step = exporter.getFinishedSpans().find((span) => span.name === 'job-step' && span.attributes['phaseline.job_id'] === jobId)!;
    expect(step.parentSpanContext?.spanId).toBe(PARENT_SPAN);
    expect(step.spanContext().traceId).toBe(TRACE_ID);
    expect(step.attributes).toMatchObject({ 'phaseline.step': 0, 'phaseline.epoch': 1, 'phaseline.phase': 'split', 'phaseline.outcome': 'handed-off' });
    expect(names(childrenOf(exporter.getFinishedSpans(), step))).toEqual(expect.arrayContaining(['commit claim', 'commit hand-off']));
    expect(finished).toMatchObject({
      jobId,
      step: 0,
      epoch: 1,
      phase: 'split',
      retryCount: 0,
      outcome: expect.objectContaining({ kind: 'handed-off' }) as unknown,
      'logging.googleapis.com/trace': `projects/demo-telemetry-trigger/traces/${TRACE_ID}`,
      'logging.googleapis.com/spanId': spanId(step),
      'logging.googleapis.com/trace_sampled': true,
    });
  });

  test('with a malformed header: the step runs and is acknowledged, as a new trace; its line has the step fields', async () => {
    const { jobId, finished } = await deliverCanary({ traceparent: 'zz-not-a-trace', 'x-cloud-trace-context': '12/abc;o=x' });
    const step = exporter.getFinishedSpans().find((span) => span.name === 'job-step' && span.attributes['phaseline.job_id'] === jobId)!;
    expect(step.parentSpanContext).toBeUndefined();
    expect(step.spanContext().traceId).not.toBe(TRACE_ID);
    expect(finished).toMatchObject({ jobId, step: 0, epoch: 1, phase: 'split', 'logging.googleapis.com/trace': `projects/demo-telemetry-trigger/traces/${step.spanContext().traceId}` });
  });
});
