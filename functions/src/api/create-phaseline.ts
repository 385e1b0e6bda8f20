/**
 * The factory that turns a project's pipelines into its deployed functions. A project's functions
 * index exports what it returns, under these names (the frontend client, the CLI and the task
 * queue address them by name):
 *
 *     export const { submitJob, runJobStep, sweepJobs, cancelJob, decideJob, opsAction } =
 *       createPhaseline({ pipelines: [myPipeline] });
 */
import type { HttpsFunction } from 'firebase-functions/v2/https';
import type { ScheduleFunction } from 'firebase-functions/v2/scheduler';
import type { TaskQueueFunction } from 'firebase-functions/v2/tasks';
import type { PipelineDefinition, PipelineRegistry } from '../core/pipeline';
import type { StoppedEffectsSettler } from '../engine/settle-stopped';
import type { Deployment } from '../triggers/deployment';
import { createJobActions } from '../triggers/job-actions';
import { createOpsAction } from '../triggers/ops';
import { createRunJobStep } from '../triggers/run-job-step';
import { createSubmitJob } from '../triggers/submit-job';
import { createSweepJobs } from '../triggers/sweep-jobs';

/** What {@link createPhaseline} is given. */
export interface PhaselineOptions<TInputs extends readonly unknown[] = readonly unknown[]> {
  /** Every pipeline the functions accept jobs for, each from `definePipeline`; names must differ. */
  readonly pipelines: { readonly [K in keyof TInputs]: PipelineDefinition<TInputs[K]> };
  /**
   * For each pipeline that applies external effects, by pipeline name: how the sweeper checks an
   * effect left in flight or unknown when a job stopped (cancelled, failed, quarantined), through
   * the same adapter the pipeline applies it with. Called when such a job is found, so a missing
   * setting is reported then, by name. Pipelines without effects need no entry.
   */
  readonly effectsAfterStop?: Readonly<Record<string, () => StoppedEffectsSettler>>;
}

/** The deployed functions, by the names a project's functions index exports them under. */
export interface PhaselineFunctions {
  /** `POST` a job (Firebase ID token, zod-validated body, `Idempotency-Key`); answers `202` with the task ID. */
  readonly submitJob: HttpsFunction;
  /** The Cloud Tasks queue function that runs one bounded step of a job per task. */
  readonly runJobStep: TaskQueueFunction<unknown>;
  /** The scheduled sweeper (every minute): reclaims expired leases, re-enqueues lost tasks, resumes due waits, settles stopped jobs' effects. */
  readonly sweepJobs: ScheduleFunction;
  /** The owner cancels a job. */
  readonly cancelJob: HttpsFunction;
  /** The owner answers the question a waiting job asks. */
  readonly decideJob: HttpsFunction;
  /** The operator console's actions (release, cancel, re-drive), for accounts with the `admin` claim. */
  readonly opsAction: HttpsFunction;
}

/** The registry and settlers the triggers run with, checked: a bad option is an error naming it, at load (so at deploy). */
export function deploymentOf<TInputs extends readonly unknown[]>(options: PhaselineOptions<TInputs>): Deployment {
  if (!Array.isArray(options.pipelines) || options.pipelines.length === 0) {
    throw new Error('createPhaseline: `pipelines` must list at least one pipeline made with definePipeline');
  }
  const pipelines = new Map<string, PipelineDefinition<unknown>>();
  // Each pipeline parses its own input before any phase sees it, so the input type is erased here.
  const given: readonly unknown[] = options.pipelines;
  for (const [index, pipeline] of given.entries()) {
    const candidate = pipeline as Partial<PipelineDefinition<unknown>> | null | undefined;
    if (typeof candidate?.name !== 'string' || !Array.isArray(candidate.phases) || typeof candidate.publish !== 'function') {
      throw new Error(`createPhaseline: pipelines[${index}] is not a pipeline: make it with definePipeline`);
    }
    if (pipelines.has(candidate.name)) throw new Error(`createPhaseline: two pipelines are named "${candidate.name}": each name must be unique`);
    pipelines.set(candidate.name, pipeline as PipelineDefinition<unknown>);
  }
  const settlers = new Map(Object.entries(options.effectsAfterStop ?? {}));
  for (const [name, settler] of settlers) {
    if (!pipelines.has(name)) throw new Error(`createPhaseline: effectsAfterStop names "${name}", which is none of the pipelines (${[...pipelines.keys()].join(', ')})`);
    if (typeof settler !== 'function') throw new Error(`createPhaseline: effectsAfterStop.${name} must be a function returning the pipeline's settler`);
  }
  const registry: PipelineRegistry = pipelines;
  return { pipelines: registry, settlerFor: (pipeline) => settlers.get(pipeline)?.() ?? null };
}

/**
 * Builds the deployed functions for `options.pipelines`. Call it once, in the functions index,
 * and export every function it returns under its own name. Loading touches no Firebase service:
 * Firestore, the task queue and Auth are connected on the first call of a function.
 */
export function createPhaseline<TInputs extends readonly unknown[]>(options: PhaselineOptions<TInputs>): PhaselineFunctions {
  const deployment = deploymentOf(options);
  const { cancelJob, decideJob } = createJobActions(deployment);
  return {
    submitJob: createSubmitJob(deployment),
    runJobStep: createRunJobStep(deployment),
    sweepJobs: createSweepJobs(deployment),
    cancelJob,
    decideJob,
    opsAction: createOpsAction(deployment),
  };
}
