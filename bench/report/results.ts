/** The shape of bench/results/results.json. */
import type { ContentionSample } from '../scenarios/contention';
import type { JobSample } from '../scenarios/compare';
import type { SweeperSample } from '../scenarios/sweeper-cost';
import type { ThroughputResult } from '../scenarios/throughput';
import type { WriteRateSample } from '../scenarios/write-rate';
import type { CapacitySummary } from './capacity';
import type { TargetCheck } from './targets';
import type { ContentionSummary, ImplementationSummary, OverheadSummary, SweeperSummary, ThroughputSummary, WriteRateSummary } from './summary';

export interface BenchMeta {
  readonly mode: 'full' | 'smoke';
  readonly startedAt: string;
  readonly finishedAt: string;
  readonly durationMs: number;
  readonly machine: {
    readonly cpus: number;
    readonly node: string;
    readonly platform: string;
    readonly memoryGiB: number;
    /** The 1-minute load average, sampled every 10 s over the run (the machine is shared): mean and highest. */
    readonly loadAverage?: { readonly mean: number; readonly max: number };
  };
  readonly firestore: string;
  readonly modelLatencyMs: number;
  readonly sensitivityLatencyMs: number | null;
  readonly providerSeed: number;
  readonly repeats: number;
  readonly inputs: readonly unknown[];
  readonly faultSchedule: readonly string[];
  readonly engineOptions: Readonly<Record<string, number>>;
  /** Scenarios that failed, with why; their sections of the report are missing. */
  readonly errors: Readonly<Record<string, string>>;
}

export interface BenchResults {
  readonly meta: BenchMeta;
  readonly comparison: { readonly summary: readonly ImplementationSummary[]; readonly samples: readonly JobSample[] } | null;
  readonly overhead: OverheadSummary | null;
  /** The overhead pair alone at a slow model (1 s a call), on fewer jobs. */
  readonly slowOverhead: { readonly latencyMs: number; readonly summary: OverheadSummary | null; readonly samples: readonly JobSample[] } | null;
  readonly sensitivity: { readonly latencyMs: number; readonly summary: readonly ImplementationSummary[]; readonly samples: readonly JobSample[] } | null;
  readonly writeRate: { readonly summary: readonly WriteRateSummary[]; readonly samples: readonly WriteRateSample[] } | null;
  readonly sweeper: { readonly summary: readonly SweeperSummary[]; readonly samples: readonly SweeperSample[] } | null;
  readonly contention: { readonly summary: readonly ContentionSummary[]; readonly samples: readonly ContentionSample[] } | null;
  readonly throughput: { readonly summary: readonly ThroughputSummary[]; readonly raw: ThroughputResult } | null;
  /** Operations, cost and ceilings per research job, from the comparison and the write rate. */
  readonly capacity: CapacitySummary | null;
  /** Where Phaseline is not ahead of a baseline, in words, computed from the figures. */
  readonly notAhead: readonly string[];
  /** The engine's targets against this run's figures, met or not worked out from them. */
  readonly targets: readonly TargetCheck[];
}
