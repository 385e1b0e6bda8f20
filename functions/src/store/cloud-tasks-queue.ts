import type { App } from 'firebase-admin/app';
import { getFunctions } from 'firebase-admin/functions';
import type { StepTask } from '../core/job';
import type { TaskQueuePort } from './task-queue';

/** The task-queue function every step and unit task goes to. */
export const STEP_FUNCTION_NAME = 'runJobStep';

/** The step function's timeout: the platform stops a step this long after it started. */
export const STEP_TIMEOUT_SECONDS = 540;

/**
 * Longer than the step function's timeout, so that Cloud Tasks never dispatches a task
 * again while its step still runs. Production's default for HTTP tasks is the same ten minutes;
 * the tasks emulator's is 60 s, after which it redelivered long steps to a second worker.
 */
export const STEP_DISPATCH_DEADLINE_SECONDS = STEP_TIMEOUT_SECONDS + 60;

function alreadyExists(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === 'functions/task-already-exists' || code === 'task-already-exists';
}

/** Cloud Tasks through the Admin SDK (the emulator when CLOUD_TASKS_EMULATOR_HOST is set). */
export function cloudTasksQueue(app: App): TaskQueuePort {
  const queue = getFunctions(app).taskQueue<StepTask>(STEP_FUNCTION_NAME);
  return {
    async enqueue(task, options) {
      try {
        await queue.enqueue(task, {
          id: options.id,
          dispatchDeadlineSeconds: STEP_DISPATCH_DEADLINE_SECONDS,
          ...(options.delaySeconds ? { scheduleDelaySeconds: Math.ceil(options.delaySeconds) } : {}),
        });
      } catch (error) {
        // A duplicate name means this hand-off was enqueued already: exactly what a deterministic ID is for.
        if (!alreadyExists(error)) throw error;
      }
    },
  };
}
