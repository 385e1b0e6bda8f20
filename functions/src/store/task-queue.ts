import type { StepTask } from '../core/job';

/** The engine's view of Cloud Tasks. Enqueuing a task ID that exists already is not an error. */
export interface TaskQueuePort {
  enqueue(task: StepTask, options: { readonly id: string; readonly delaySeconds?: number }): Promise<void>;
}
