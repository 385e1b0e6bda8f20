/**
 * The capacity and cost model printed with the figures: Firestore operations and their list-price
 * cost per 1,000 research jobs, the jobs per second one task queue and one job document can carry,
 * and which ceiling comes first. Everything per job is measured by the comparison (Phaseline's
 * column) and the write-rate scenario; the platform limits are the step queue's own settings
 * (lib/cloud-tasks.ts), Cloud Tasks' per-queue maximum and Firestore's per-document guidance;
 * prices are in lib/prices.ts with their source.
 */
import { CLOUD_TASKS_MAX_DISPATCHES_PER_QUEUE, STEP_QUEUE } from '../lib/cloud-tasks';
import { DOCUMENT_SUSTAINED_WRITES_PER_SECOND, FIRESTORE_PRICES, FIRESTORE_PRICES_SOURCE } from '../lib/prices';
import { max } from '../lib/stats';
import type { ImplementationSummary, WriteRateSummary } from './summary';

/** Model latency the concurrency ceiling is also worked out at: a fast real model call. */
export const REAL_CALL_MS = 1_000;

export interface Operations {
  readonly reads: number;
  /** Writes that are not deletes. */
  readonly writes: number;
  readonly deletes: number;
}

export interface Cost {
  readonly location: string;
  readonly prices: { readonly read: number; readonly write: number; readonly delete: number };
  /** USD per 1,000 jobs. */
  readonly faultFree: number;
  readonly faulted: number;
}

export interface Ceiling {
  readonly name: string;
  readonly jobsPerSecond: number;
  readonly how: string;
  /** False for the row worked out at REAL_CALL_MS per model call. */
  readonly measured: boolean;
}

export interface CapacitySummary {
  readonly modelLatencyMs: number;
  readonly perJob: { readonly faultFree: Operations; readonly faulted: Operations };
  readonly costs: readonly Cost[];
  readonly pricesSource: string;
  readonly tasksPerJob: { readonly faultFree: number; readonly faulted: number };
  readonly queue: {
    readonly configuredDispatchesPerSecond: number;
    readonly maxDispatchesPerQueue: number;
    readonly maxConcurrentDispatches: number;
  };
  /** Function-seconds per fault-free job as measured, and worked out for REAL_CALL_MS per model call. */
  readonly functionSecondsPerJob: number;
  readonly functionSecondsPerJobAtRealCalls: number;
  readonly modelCallsPerJob: number;
  readonly jobDocument: {
    /** Writes to the job document over a fault-free job. */
    readonly writesPerJob: number;
    /** The same over the job's wall time at the bench's model latency (bursty: steps follow each other at once). */
    readonly writesPerSecondAtBenchSpeed: number;
    /** Sustained progress writes per second of a running step whose sections finish fast (write-rate scenario), worst pace. */
    readonly sustainedWritesPerJobSecond: number;
    readonly limitPerSecond: number;
  };
  /** Fault-free writes per job to documents outside the job (shared by every job): each caps jobs/s at limit / writes. */
  readonly sharedWritesPerJob: Readonly<Record<string, number>>;
  readonly ceilings: readonly Ceiling[];
}

function cost(operations: Operations, prices: { read: number; write: number; delete: number }): number {
  return (1000 * (operations.reads * prices.read + operations.writes * prices.write + operations.deletes * prices.delete)) / 100_000;
}

export function summarizeCapacity(
  comparison: readonly ImplementationSummary[] | undefined,
  writeRate: readonly WriteRateSummary[] | undefined,
  modelLatencyMs: number,
): CapacitySummary | null {
  const ours = comparison?.find((item) => item.implementation === 'phaseline');
  if (!ours) return null;
  const operations = (reads: number, writes: number, deletes: number): Operations => ({ reads, writes: writes - deletes, deletes });
  const faultFree = operations(ours.readsFaultFree, ours.writesFaultFree, ours.deletesFaultFree);
  const faulted = operations(ours.readsFaulted, ours.writesFaulted, ours.deletesFaulted);
  const functionSeconds = ours.taskMsFaultFree / 1000;
  const atRealCalls = functionSeconds + (ours.modelCallsFaultFree * (REAL_CALL_MS - modelLatencyMs)) / 1000;
  const queue = {
    configuredDispatchesPerSecond: STEP_QUEUE.maxDispatchesPerSecond,
    maxDispatchesPerQueue: CLOUD_TASKS_MAX_DISPATCHES_PER_QUEUE,
    maxConcurrentDispatches: STEP_QUEUE.maxConcurrentDispatches,
  };
  const sharedWritesPerJob = Object.fromEntries(Object.entries(ours.writesByDocumentFaultFree).filter(([kind, count]) => kind.endsWith('(outside the job)') && count > 0));
  const tasks = ours.deliveriesFaultFree;
  const ceilings: Ceiling[] = [
    {
      name: `the step queue's dispatch rate as configured (${queue.configuredDispatchesPerSecond}/s)`,
      jobsPerSecond: queue.configuredDispatchesPerSecond / tasks,
      how: `${queue.configuredDispatchesPerSecond} dispatches/s ÷ ${tasks.toFixed(1)} tasks per job`,
      measured: true,
    },
    {
      name: `Cloud Tasks' maximum for one queue (${queue.maxDispatchesPerQueue} dispatches/s)`,
      jobsPerSecond: queue.maxDispatchesPerQueue / tasks,
      how: `${queue.maxDispatchesPerQueue} dispatches/s ÷ ${tasks.toFixed(1)} tasks per job`,
      measured: true,
    },
    {
      name: `the step queue's concurrent dispatches (${queue.maxConcurrentDispatches}), at ${modelLatencyMs} ms per model call`,
      jobsPerSecond: queue.maxConcurrentDispatches / functionSeconds,
      how: `${queue.maxConcurrentDispatches} tasks at once ÷ ${functionSeconds.toFixed(2)} function-seconds per job (measured)`,
      measured: true,
    },
    {
      name: `the step queue's concurrent dispatches (${queue.maxConcurrentDispatches}), at ${REAL_CALL_MS / 1000} s per model call`,
      jobsPerSecond: queue.maxConcurrentDispatches / atRealCalls,
      how:
        `${queue.maxConcurrentDispatches} tasks at once ÷ ${atRealCalls.toFixed(1)} function-seconds per job ` +
        `(worked out: the measured ${functionSeconds.toFixed(2)} s plus ${ours.modelCallsFaultFree.toFixed(1)} model calls × ${((REAL_CALL_MS - modelLatencyMs) / 1000).toFixed(2)} s more each)`,
      measured: false,
    },
    ...Object.entries(sharedWritesPerJob).map(([kind, count]) => ({
      name: `one shared document in ${kind}`,
      jobsPerSecond: DOCUMENT_SUSTAINED_WRITES_PER_SECOND / count,
      how: `about ${DOCUMENT_SUSTAINED_WRITES_PER_SECOND} write/s ÷ ${count.toFixed(1)} writes per job`,
      measured: true,
    })),
  ];
  ceilings.sort((a, b) => a.jobsPerSecond - b.jobsPerSecond);
  return {
    modelLatencyMs,
    perJob: { faultFree, faulted },
    costs: FIRESTORE_PRICES.map((prices) => ({
      location: prices.location,
      prices: { read: prices.read, write: prices.write, delete: prices.delete },
      faultFree: cost(faultFree, prices),
      faulted: cost(faulted, prices),
    })),
    pricesSource: FIRESTORE_PRICES_SOURCE,
    tasksPerJob: { faultFree: tasks, faulted: ours.deliveriesFaulted },
    queue,
    functionSecondsPerJob: functionSeconds,
    functionSecondsPerJobAtRealCalls: atRealCalls,
    modelCallsPerJob: ours.modelCallsFaultFree,
    jobDocument: {
      writesPerJob: ours.jobDocumentWritesFaultFree,
      writesPerSecondAtBenchSpeed: ours.jobDocumentWritesFaultFree / (ours.wallMsFaultFree / 1000),
      sustainedWritesPerJobSecond: max((writeRate ?? []).map((rate) => rate.progressWritesPerSecond).filter((rate) => Number.isFinite(rate))),
      limitPerSecond: DOCUMENT_SUSTAINED_WRITES_PER_SECOND,
    },
    sharedWritesPerJob,
    ceilings,
  };
}
