/**
 * Operations only Cloud Tasks itself can do, on the queue of the step function: how deep it is
 * and how old its oldest task, and pausing or resuming dispatch (during a provider outage, say).
 * They go through @google-cloud/tasks with Application Default Credentials; the Cloud Tasks
 * emulator does not serve that API, so under the emulator they refuse plainly.
 */
import { STEP_FUNCTION_NAME } from '../../functions/src/store/cloud-tasks-queue';
import type { Command, QueueAction } from './args';
import { CliError, EXIT } from './errors';
import { dateTime, duration, table, type TimeOptions } from './format';
import type { Io } from './io';
import type { DeployedTarget, Target } from './target';

export interface QueueStats {
  readonly name: string;
  readonly state: string;
  readonly tasks: number | null;
  readonly oldestTaskMs: number | null;
  readonly dispatchedLastMinute: number | null;
  readonly running: number | null;
  readonly effectiveRatePerSecond: number | null;
  readonly maxRatePerSecond: number | null;
  readonly maxConcurrent: number | null;
}

export interface QueueAdmin {
  stats(name: string): Promise<QueueStats>;
  /** Returns the queue's state afterwards. */
  pause(name: string): Promise<string>;
  resume(name: string): Promise<string>;
  close(): Promise<void>;
}

export function queueName(target: DeployedTarget): string {
  // firebase-tools names a task-queue function's queue after the function.
  return `projects/${target.projectId}/locations/${target.region}/queues/${STEP_FUNCTION_NAME}`;
}

export function notUnderEmulator(action: QueueAction): string {
  return (
    `\`phaseline queue ${action}\` is not available under the emulator: the Cloud Tasks emulator only takes the tasks the ` +
    'functions enqueue and does not serve the Cloud Tasks API (getQueue, pauseQueue, resumeQueue) this command uses. ' +
    `Run it against a deployed project: phaseline --project <project-id> queue ${action}`
  );
}

type Numberish = number | string | { toString(): string } | null | undefined;
const toNumber = (value: Numberish): number | null => (value === null || value === undefined ? null : Number(String(value)));

/** The real client, loaded only when a queue command runs (google-gax is large). */
export async function cloudTasksAdmin(target: DeployedTarget): Promise<QueueAdmin> {
  const { v2, v2beta3 } = await import('@google-cloud/tasks');
  // Queue statistics are only in the v2beta3 API (with an explicit read mask); pause and resume are GA in v2.
  const beta = new v2beta3.CloudTasksClient({ projectId: target.projectId });
  const ga = new v2.CloudTasksClient({ projectId: target.projectId });
  const state = (value: unknown): string => (typeof value === 'string' ? value : typeof value === 'number' ? `state ${value}` : 'STATE_UNSPECIFIED');
  return {
    async stats(name) {
      const [queue] = await beta.getQueue({ name, readMask: { paths: ['name', 'state', 'rate_limits', 'stats'] } });
      const oldest = queue.stats?.oldestEstimatedArrivalTime;
      const oldestSeconds = toNumber(oldest?.seconds);
      return {
        name: queue.name ?? name,
        state: state(queue.state),
        tasks: toNumber(queue.stats?.tasksCount),
        oldestTaskMs: oldestSeconds === null ? null : oldestSeconds * 1000 + Math.floor((oldest?.nanos ?? 0) / 1e6),
        dispatchedLastMinute: toNumber(queue.stats?.executedLastMinuteCount),
        running: toNumber(queue.stats?.concurrentDispatchesCount),
        effectiveRatePerSecond: toNumber(queue.stats?.effectiveExecutionRate),
        maxRatePerSecond: toNumber(queue.rateLimits?.maxDispatchesPerSecond),
        maxConcurrent: toNumber(queue.rateLimits?.maxConcurrentDispatches),
      };
    },
    async pause(name) {
      const [queue] = await ga.pauseQueue({ name });
      return state(queue.state);
    },
    async resume(name) {
      const [queue] = await ga.resumeQueue({ name });
      return state(queue.state);
    },
    close: async () => {
      await Promise.all([beta.close(), ga.close()]);
    },
  };
}

export function queueStatsLines(stats: QueueStats, nowMs: number, options: TimeOptions = {}): string[] {
  const show = (value: number | null, unit = ''): string => (value === null ? 'unknown' : `${value}${unit}`);
  const oldest =
    stats.tasks === 0 || stats.oldestTaskMs === null ? 'none' : `${dateTime(stats.oldestTaskMs, options)} (${duration(nowMs - stats.oldestTaskMs)} ago)`;
  const rate = stats.effectiveRatePerSecond === null ? 'unknown' : `${Number(stats.effectiveRatePerSecond.toFixed(2))}/s`;
  return [
    `Queue ${stats.name}: ${stats.state}`,
    ...table(
      ['', ''],
      [
        ['  tasks waiting', show(stats.tasks)],
        ['  oldest task', oldest],
        ['  dispatched', `${show(stats.dispatchedLastMinute)} in the last minute`],
        ['  running now', show(stats.running)],
        ['  dispatch rate', `${rate} (at most ${show(stats.maxRatePerSecond, '/s')}, ${show(stats.maxConcurrent)} at once)`],
      ],
    ).slice(1),
  ];
}

type QueueCommand = Extract<Command, { name: 'queue' }>;

export async function queueCommand(
  target: Target,
  io: Io,
  command: QueueCommand,
  openAdmin: (target: DeployedTarget) => Promise<QueueAdmin> = cloudTasksAdmin,
  now: () => number = Date.now,
  time: TimeOptions = {},
): Promise<number> {
  if (target.kind === 'local') throw new CliError(notUnderEmulator(command.action));
  const name = queueName(target);
  const admin = await openAdmin(target);
  try {
    switch (command.action) {
      case 'stats':
        for (const line of queueStatsLines(await admin.stats(name), now(), time)) io.out(line);
        break;
      case 'pause':
        io.out(`Queue ${name} is now ${await admin.pause(name)}: no step or unit task is dispatched until \`phaseline queue resume\`. Tasks keep being accepted.`);
        break;
      case 'resume':
        io.out(`Queue ${name} is now ${await admin.resume(name)}: dispatching again.`);
        break;
    }
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    throw new CliError(`queue ${command.action} on ${name} failed: ${message}`);
  } finally {
    await admin.close();
  }
  return EXIT.ok;
}
