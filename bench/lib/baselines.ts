/**
 * The two approaches the bench compares Phaseline with, written here for that purpose, plus the
 * same phases with no durability at all. All three run the research pipeline's own phases (the
 * same `run`, `runUnit`, `join` and `publish`, the same section runner with its in-call retries)
 * inside one task, with the experts in parallel, and differ only in what survives a failure:
 *
 * - `whole-job` ("retry the whole job"): one Cloud Tasks task runs the job from the top; any
 *   failure fails the task and Cloud Tasks redelivers it, which starts again from the outline.
 * - `phase-checkpoints` ("phase checkpoints only"): the same task, but every finished phase is
 *   saved to Firestore and a redelivery resumes at the first phase without a checkpoint. Sections
 *   and transcripts live in memory and are lost with the attempt.
 * - `in-memory`: the phases in-process with no Firestore and no faults (the overhead yardstick).
 *
 * Both durable baselines keep a job document (status, attempts, last error), skip a redelivery
 * of a job already completed (checked when the attempt starts, as handlers usually do), and
 * publish by appending the answer to the job's results, as a chat answer is posted.
 *
 * Redelivery is not slept: the wait Cloud Tasks would impose is computed from the step queue's
 * retry rules (lib/cloud-tasks.ts, read from runJobStep's settings) and reported as virtual
 * recovery wait. A killed worker fails its request at once (the platform answers 5xx), so the task
 * is retried after the queue's backoff; a frozen worker is only given up on at the function
 * timeout.
 */
import { DEFAULT_MAX_SERVER_DELAY_SECONDS } from '../../functions/src/core/server-delay';
import { FieldValue, type Firestore } from 'firebase-admin/firestore';
import { seededRandom, type Clock } from '../../functions/src/core/clock';
import { describeError, RetryableError } from '../../functions/src/core/errors';
import { resumePhaseIndex, type PhaseDefinition, type PipelineDefinition, type StepContext } from '../../functions/src/core/pipeline';
import { createStepContext, noDurableWrites, type ContextParts, type DurableWrites } from '../../functions/src/engine/context';
import { redeliveryDelayMs, STEP_QUEUE } from './cloud-tasks';
import { newWorker, runAsWorker } from './faults';
import type { ProjectClients } from './firestore';

export type BaselineKind = 'whole-job' | 'phase-checkpoints' | 'in-memory';

export class WorkerCrashed extends Error {
  constructor() {
    super('bench: the worker was killed');
    this.name = 'WorkerCrashed';
  }
}

export interface BaselineJobRun {
  readonly jobId: string;
  readonly status: string;
  readonly outcome: string | null;
  readonly wallMs: number;
  readonly virtualWaitMs: number;
  /** The same, by cause. */
  readonly waits: Readonly<Record<string, number>>;
  /** Task deliveries, the first one included. */
  readonly attempts: number;
  readonly workersLost: number;
  /** Per lost worker: the virtual wait until the task was delivered again. */
  readonly recoveries: readonly { readonly fault: 'crash' | 'stall'; readonly waitMs: number }[];
  readonly failedAttempts: number;
  /** What frozen attempts did when they woke after the job had finished. */
  readonly zombieOutcomes: readonly string[];
}

/** Sections and transcripts in memory; anything else the engine offers (effects) is refused, as the research pipeline needs none. */
function memoryDurable(): DurableWrites {
  const transcripts = new Map<string, unknown>();
  return {
    ...noDurableWrites('an in-memory baseline'),
    writeSection: () => Promise.resolve(),
    loadTranscript: (sectionId) => Promise.resolve(transcripts.get(sectionId) ?? null),
    saveTranscript: (sectionId, transcript) => {
      transcripts.set(sectionId, transcript);
      return Promise.resolve();
    },
    saveTranscriptBehind: (sectionId, transcript) => {
      transcripts.set(sectionId, transcript);
    },
  };
}

type AttemptResult = 'completed' | 'already-completed';

export class BaselineRunner {
  private sequence = 0;

  constructor(
    readonly kind: BaselineKind,
    private readonly project: ProjectClients | null,
    private readonly clock: Clock,
  ) {
    if (kind !== 'in-memory' && project === null) throw new Error(`The ${kind} baseline needs Firestore`);
  }

  private get db(): Firestore | null {
    return this.kind === 'in-memory' ? null : (this.project?.db ?? null);
  }

  /** Submits one job and delivers its task until it completes. */
  async runJob(pipeline: PipelineDefinition<unknown>, input: unknown, hooks: { wakeFrozen?(): number } = {}): Promise<BaselineJobRun> {
    const startedAt = performance.now();
    const db = this.db;
    this.sequence += 1;
    let jobId = `mem-${this.sequence}`;
    if (db) {
      const ref = db.collection('jobs').doc();
      await ref.set({ pipeline: pipeline.name, input, status: 'queued', attempts: 0, phase: null, lastError: null, createdAtMs: Date.now() });
      jobId = ref.id;
    }
    const zombies: Promise<string>[] = [];
    let virtualWaitMs = 0;
    const waits: Record<string, number> = {};
    const wait = (cause: string, ms: number): void => {
      virtualWaitMs += ms;
      waits[cause] = (waits[cause] ?? 0) + ms;
    };
    let failures = 0;
    let workersLost = 0;
    const recoveries: { fault: 'crash' | 'stall'; waitMs: number }[] = [];
    let attempts = 0;
    let finishedAt: number | undefined;
    let status = 'failed';
    while (attempts < STEP_QUEUE.maxAttempts) {
      attempts += 1;
      const controller = new AbortController();
      const worker = newWorker(`${this.kind}-${jobId}-attempt-${attempts}`, () => controller.abort(new WorkerCrashed()));
      const work = runAsWorker(worker, () => this.attempt(jobId, pipeline, input, controller.signal));
      const settled = work.then(
        (result) => ({ kind: 'ok' as const, result }),
        (error: unknown) => ({ kind: 'error' as const, error }),
      );
      const first = await Promise.race([settled, worker.down.then((kind) => ({ kind }))]);
      if (first.kind === 'ok') {
        finishedAt = performance.now();
        status = 'completed';
        break;
      }
      failures += 1;
      if (first.kind === 'stall') {
        // Frozen: the request fails at the function timeout, and Cloud Tasks delivers the task again.
        workersLost += 1;
        zombies.push(settled.then((late) => (late.kind === 'ok' ? late.result : `error: ${describeError(late.error)}`)));
        const waitMs = STEP_QUEUE.timeoutSeconds * 1000 + redeliveryDelayMs(failures);
        recoveries.push({ fault: 'stall', waitMs });
        wait('frozen worker: function timeout, then backoff', waitMs);
        continue;
      }
      if (first.kind === 'crash') {
        workersLost += 1;
        await settled; // every branch of the killed attempt has stopped
        recoveries.push({ fault: 'crash', waitMs: redeliveryDelayMs(failures) });
        wait('killed worker: backoff before the redelivery', redeliveryDelayMs(failures));
        continue;
      }
      wait('error: backoff before the redelivery', redeliveryDelayMs(failures));
    }
    const wallMs = (finishedAt ?? performance.now()) - startedAt;
    const zombieOutcomes: string[] = [];
    if (hooks.wakeFrozen?.()) zombieOutcomes.push(...(await Promise.all(zombies)));
    let outcome = this.lastOutcome;
    if (this.project && db) {
      const job = await this.project.inspector.doc(`jobs/${jobId}`).get();
      status = String(job.get('status'));
      outcome = (job.get('outcome') as string | undefined) ?? null;
    }
    return { jobId, status, outcome, wallMs, virtualWaitMs, waits, attempts, workersLost, recoveries, failedAttempts: failures, zombieOutcomes };
  }

  private lastOutcome: string | null = null;

  /** One delivery of the job's task. */
  private async attempt(jobId: string, pipeline: PipelineDefinition<unknown>, rawInput: unknown, signal: AbortSignal): Promise<AttemptResult> {
    const db = this.db;
    const ref = db?.doc(`jobs/${jobId}`);
    if (ref) {
      const job = await ref.get();
      if (job.get('status') === 'completed') return 'already-completed';
      await ref.update({ status: 'running', attempts: FieldValue.increment(1), updatedAtMs: Date.now() });
    }
    const input = pipeline.input.parse(rawInput);
    const random = seededRandom(7);
    const states = new Map<string, unknown>();
    if (ref && this.kind === 'phase-checkpoints') {
      const phases = new Map(pipeline.phases.map((phase) => [phase.name, phase]));
      for (const doc of (await ref.collection('checkpoints').get()).docs) {
        const parsed = phases.get(doc.id)?.state.safeParse(doc.get('state'));
        if (parsed?.success) states.set(doc.id, parsed.data);
      }
    }
    const parts = (phase: PhaseDefinition<unknown, unknown>, unit: string | null, durable: DurableWrites): ContextParts<unknown> => ({
      jobId,
      input,
      unit,
      decisions: {},
      signal,
      clock: this.clock,
      random,
      phase,
      states,
      sections: [],
      flusher: null,
      deadlineMs: Number.POSITIVE_INFINITY,
      budgetMs: 0,
      limits: { maxServerDelayMs: DEFAULT_MAX_SERVER_DELAY_SECONDS * 1000 },
      durable,
    });
    try {
      for (let index = resumePhaseIndex(pipeline, new Set(states.keys())); index < pipeline.phases.length; index += 1) {
        const phase = pipeline.phases[index] as PhaseDefinition<unknown, unknown>;
        const state = await this.runPhase(phase, (unit, durable) => createStepContext(parts(phase, unit, durable)));
        states.set(phase.name, state);
        if (ref && this.kind === 'phase-checkpoints') {
          const batch = ref.firestore.batch();
          batch.set(ref.collection('checkpoints').doc(phase.name), { state, savedAtMs: Date.now() });
          batch.update(ref, { phase: phase.name, updatedAtMs: Date.now() });
          await batch.commit();
        }
      }
      const lastPhase = pipeline.phases[pipeline.phases.length - 1] as PhaseDefinition<unknown, unknown>;
      const result = pipeline.publish(createStepContext(parts({ ...lastPhase, needs: pipeline.phases }, null, noDurableWrites('publication'))));
      if (ref) {
        const batch = ref.firestore.batch();
        batch.set(ref.collection('results').doc(), { ...result, createdAtMs: Date.now() });
        batch.update(ref, { status: 'completed', outcome: result.outcome, updatedAtMs: Date.now() });
        await batch.commit();
      }
      this.lastOutcome = result.outcome;
      return 'completed';
    } catch (error) {
      // A killed worker writes nothing more; a live one records the error before failing the task.
      if (ref && !signal.aborted) await ref.update({ lastError: describeError(error), updatedAtMs: Date.now() });
      throw error;
    }
  }

  private async runPhase(phase: PhaseDefinition<unknown, unknown>, context: (unit: string | null, durable: DurableWrites) => StepContext<unknown>): Promise<unknown> {
    if (phase.run) {
      const outcome = await phase.run(context(null, memoryDurable()));
      if (outcome.kind !== 'done') throw new RetryableError(`Phase ${phase.name} ended with ${outcome.kind}`);
      return phase.state.parse(outcome.state);
    }
    const fanOut = phase.fanOut;
    if (!fanOut) throw new Error(`Phase ${phase.name} has neither run nor fanOut`);
    const coordinator = context(null, noDurableWrites('a coordinator'));
    const units = [...new Set(fanOut.units(coordinator))];
    // Every branch is awaited before the phase fails, so a failed attempt leaves nothing running.
    const settled = await Promise.allSettled(units.map((unit) => fanOut.runUnit(context(unit, memoryDurable()), unit)));
    const results = new Map<string, unknown>();
    for (const [position, result] of settled.entries()) {
      if (result.status === 'rejected') throw result.reason;
      if (result.value.kind !== 'done') throw new RetryableError(`Unit ${units[position] ?? '?'} of ${phase.name} ended with ${result.value.kind}`);
      results.set(units[position] as string, fanOut.unitState.parse(result.value.state));
    }
    return phase.state.parse(fanOut.join(results, coordinator));
  }
}
