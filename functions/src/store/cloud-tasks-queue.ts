import type { App } from 'firebase-admin/app';
import { getFunctions } from 'firebase-admin/functions';
import type { StepTask } from '../core/job';
import type { TaskQueuePort } from './task-queue';

/** The task-queue function every step and unit task goes to. */
export const STEP_FUNCTION_NAME = 'runJobStep';

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
          ...(options.delaySeconds ? { scheduleDelaySeconds: Math.ceil(options.delaySeconds) } : {}),
        });
      } catch (error) {
        // A duplicate name means this hand-off was enqueued already: exactly what a deterministic ID is for.
        if (!alreadyExists(error)) throw error;
      }
    },
  };
}
