/**
 * One task = one bounded step. A step claims the job (or a fan-out unit) with a new fencing epoch,
 * works out from stored state where to resume, runs one phase (or unit) inside a time budget with
 * a heartbeat, and makes the result durable through owner-checked commits before handing off to
 * the next task. Losing the claim aborts the step through its AbortSignal. The step itself lives
 * in ./step, one file per concern; this module is its public face.
 */
export { runStep } from './step/index';
export { defaultWorkerName, type RunnerDeps, type StepOutcome } from './step/running';
