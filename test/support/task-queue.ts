import type { StepTask } from '../../functions/src/core/job';
import type { TaskQueuePort } from '../../functions/src/store/task-queue';

export interface RecordedTask {
  readonly id: string;
  readonly task: StepTask;
  readonly delaySeconds: number;
}

/** A task queue port that records what was enqueued and, like Cloud Tasks, drops duplicate IDs. */
export class RecordingTaskQueue implements TaskQueuePort {
  readonly tasks: RecordedTask[] = [];
  readonly duplicates: string[] = [];
  /** Every ID ever accepted: Cloud Tasks keeps rejecting a name after its task has run. */
  private readonly seen = new Set<string>();
  /** Set to make the next enqueue calls fail, as a lost connection to Cloud Tasks would. */
  failNext = 0;

  enqueue(task: StepTask, options: { readonly id: string; readonly delaySeconds?: number }): Promise<void> {
    if (this.failNext > 0) {
      this.failNext -= 1;
      return Promise.reject(new Error('Cloud Tasks unavailable (injected)'));
    }
    if (this.seen.has(options.id)) {
      this.duplicates.push(options.id);
      return Promise.resolve();
    }
    this.seen.add(options.id);
    this.tasks.push({ id: options.id, task, delaySeconds: options.delaySeconds ?? 0 });
    return Promise.resolve();
  }

  /** Removes and returns every task enqueued so far. */
  drain(): RecordedTask[] {
    return this.tasks.splice(0, this.tasks.length);
  }
}
