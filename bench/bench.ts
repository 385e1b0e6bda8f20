/**
 * The whole benchmark as one function: starts (or reuses) the Firestore emulator, warms it up,
 * runs each scenario of the plan, and returns every figure. `run.ts` is the command line around it;
 * the smoke test calls it with a tiny plan.
 */
import { cpus, loadavg, totalmem } from 'node:os';
import { ManualClock } from '../functions/src/core/clock';
import { DEFAULT_ENGINE_OPTIONS, resolveEngineOptions } from '../functions/src/core/options';
import type { ResearchInput } from '../functions/src/pipelines/research';
import { firestoreCircuit } from '../functions/src/store/provider-circuit';
import { BaselineRunner } from './lib/baselines';
import { describeFault, type Fault } from './lib/faults';
import { openProject, startBenchFirestore, type ProjectClients } from './lib/firestore';
import { PhaselineDriver } from './lib/phaseline-driver';
import { closedCircuit, FAULT_SCHEDULE, PROVIDER_SEED, RESEARCH_INPUTS, researchKit } from './lib/workload';
import { summarizeCapacity } from './report/capacity';
import { notAhead } from './report/markdown';
import type { BenchMeta, BenchResults } from './report/results';
import { evaluateTargets } from './report/targets';
import { summarizeComparison, summarizeContention, summarizeOverhead, summarizeSweeper, summarizeThroughput, summarizeWriteRate } from './report/summary';
import { runComparison, runOverhead, type JobSample } from './scenarios/compare';
import { measureContention, type ContentionSample } from './scenarios/contention';
import { measureSweeps, type SweeperSample } from './scenarios/sweeper-cost';
import { measureThroughput, type ThroughputResult } from './scenarios/throughput';
import type { ThroughputPlan } from './scenarios/throughput-client';
import { measureWriteRate, type WriteRateSample } from './scenarios/write-rate';

export const SCENARIOS = ['compare', 'sensitivity', 'slow-overhead', 'write-rate', 'sweeper', 'contention', 'throughput'] as const;
export type ScenarioName = (typeof SCENARIOS)[number];

export interface BenchPlan {
  readonly mode: 'full' | 'smoke';
  readonly repeats: number;
  readonly inputs: readonly ResearchInput[];
  readonly latencyMs: number;
  readonly faults: readonly Fault[];
  /** The comparison again at a slower model, on fewer jobs. */
  readonly sensitivity: { readonly latencyMs: number; readonly inputs: number; readonly repeats: number } | null;
  /** The overhead pair alone (Phaseline and in-process, fault-free) at a slow model, on fewer jobs. */
  readonly slowOverhead: { readonly latencyMs: number; readonly inputs: number; readonly repeats: number } | null;
  /** Unmeasured jobs run first, so the emulator's JIT is warm. */
  readonly warmupJobs: number;
  readonly writeRate: { readonly paces: readonly { readonly intervalMs: number; readonly sections: number }[]; readonly repeats: number };
  readonly sweeper: { readonly totals: readonly number[]; readonly expired: number; readonly repeats: number };
  readonly contention: { readonly claimers: readonly number[]; readonly jobs: readonly number[]; readonly repeats: number };
  readonly throughput: ThroughputPlan | null;
  /** Emulator project IDs start with this, so parallel runs (tests) never share data. */
  readonly projectPrefix: string;
  readonly only?: ReadonlySet<ScenarioName>;
  readonly verbose?: boolean;
}

export type Log = (line: string) => void;

async function warmUp(project: ProjectClients, plan: BenchPlan, log: Log): Promise<void> {
  if (plan.warmupJobs <= 0) return;
  const input = plan.inputs[0];
  if (!input) return;
  const driver = new PhaselineDriver(project, resolveEngineOptions());
  for (let index = 0; index < plan.warmupJobs; index += 1) {
    const kit = researchKit(driver.clock, index === 0 ? [] : plan.faults, firestoreCircuit(project.db, 'offline'), plan.latencyMs);
    const run = await driver.runJob(kit.registry, 'research', input, { wakeFrozen: () => kit.provider.wakeFrozen() });
    log(`  warm-up job ${index + 1}: ${run.status} in ${Math.round(run.wallMs)} ms`);
  }
  for (const kind of ['whole-job', 'phase-checkpoints'] as const) {
    const clock = new ManualClock();
    const kit = researchKit(clock, [], closedCircuit, plan.latencyMs);
    await new BaselineRunner(kind, project, clock).runJob(kit.pipeline, input);
  }
}

export async function runBench(plan: BenchPlan, log: Log = console.log): Promise<BenchResults> {
  const startedAt = new Date();
  const started = performance.now();
  const errors: Record<string, string> = {};
  const wanted = (name: ScenarioName): boolean => plan.only === undefined || plan.only.has(name);
  const stamp = (): string => `[${((performance.now() - started) / 1000).toFixed(0).padStart(4)} s]`;
  const step = async <T>(name: ScenarioName, work: () => Promise<T>): Promise<T | null> => {
    if (!wanted(name)) return null;
    log(`${stamp()} ${name}`);
    try {
      return await work();
    } catch (error) {
      errors[name] = error instanceof Error ? (error.stack ?? error.message) : String(error);
      log(`${stamp()} ${name} FAILED: ${errors[name]}`);
      return null;
    }
  };

  // Other work on a shared machine moves every timing figure: the load is recorded with them.
  const loads: number[] = [loadavg()[0] ?? 0];
  const sampler = setInterval(() => loads.push(loadavg()[0] ?? 0), 10_000);
  sampler.unref();
  const firestore = await startBenchFirestore();
  log(`${stamp()} Firestore emulator on ${firestore.host}${firestore.emulator.startedHere ? '' : ' (already running)'}`);
  const projects = {
    warmup: openProject(`${plan.projectPrefix}-warmup`),
    phaseline: openProject(`${plan.projectPrefix}-phaseline`),
    baselines: openProject(`${plan.projectPrefix}-baselines`),
    engine: openProject(`${plan.projectPrefix}-engine`),
  };
  const scenarios = async () => {
    if (wanted('compare') || wanted('sensitivity') || (wanted('slow-overhead') && plan.slowOverhead)) {
      log(`${stamp()} warm-up`);
      await projects.warmup.reset();
      await warmUp(projects.warmup, plan, log);
    }
    const comparison = await step('compare', async () => ({
      samples: await runComparison({
        repeats: plan.repeats,
        inputs: plan.inputs,
        faults: plan.faults,
        latencyMs: plan.latencyMs,
        phaselineProject: projects.phaseline,
        baselineProject: projects.baselines,
        lostTaskVariant: true,
        log,
      }),
    }));
    const sensitivity = plan.sensitivity;
    const sensitivitySamples = !sensitivity
      ? null
      : await step('sensitivity', () =>
          runComparison({
            repeats: sensitivity.repeats,
            inputs: plan.inputs.slice(0, sensitivity.inputs),
            faults: plan.faults,
            latencyMs: sensitivity.latencyMs,
            phaselineProject: projects.phaseline,
            baselineProject: projects.baselines,
            log,
          }),
        );
    const slowOverhead = plan.slowOverhead;
    const slowOverheadSamples = !slowOverhead
      ? null
      : await step('slow-overhead', () =>
          runOverhead({
            repeats: slowOverhead.repeats,
            inputs: plan.inputs.slice(0, slowOverhead.inputs),
            latencyMs: slowOverhead.latencyMs,
            phaselineProject: projects.phaseline,
            log,
          }),
        );
    const writeRate = await step('write-rate', async () => {
      const samples: WriteRateSample[] = [];
      await projects.engine.reset();
      for (let repeat = 0; repeat < plan.writeRate.repeats; repeat += 1) {
        for (const pace of plan.writeRate.paces) {
          const sample = await measureWriteRate(projects.engine, pace.intervalMs, pace.sections, repeat);
          samples.push(sample);
          log(`  write-rate r${repeat} every ${pace.intervalMs} ms: ${sample.sectionsPerSecond.toFixed(1)} sections/s, ${sample.jobWrites} job writes, max ${sample.maxJobWritesInOneSecond} in 1 s`);
        }
      }
      return samples;
    });
    const sweeper = await step('sweeper', async () => {
      const samples: SweeperSample[] = [];
      const equalityOnly = new Map<number, number>();
      for (const total of plan.sweeper.totals) {
        const measured = await measureSweeps(projects.engine, total, plan.sweeper.expired, plan.sweeper.repeats);
        samples.push(...measured.samples);
        equalityOnly.set(total, measured.equalityOnlyReads);
        log(`  sweeper ${total} jobs: ${measured.samples.map((sample) => `${sample.documentsRead} read/${Math.round(sample.ms)} ms`).join(', ')}; no index: ${measured.equalityOnlyReads}`);
      }
      await projects.engine.reset();
      return { samples, equalityOnly };
    });
    const contention = await step('contention', async () => {
      const samples: ContentionSample[] = [];
      for (let repeat = 0; repeat < plan.contention.repeats; repeat += 1) {
        for (const claimers of plan.contention.claimers) {
          for (const jobs of plan.contention.jobs) {
            const sample = await measureContention(projects.engine, claimers, jobs, repeat);
            samples.push(sample);
            log(`  contention r${repeat} ${claimers} claimers / ${jobs} jobs: ${sample.winners} winners, ${sample.retriedAttempts} retried, ${Math.round(sample.settleMs)} ms`);
          }
        }
      }
      await projects.engine.reset();
      return samples;
    });
    const throughputPlan = plan.throughput;
    const throughput = !throughputPlan
      ? null
      : await step('throughput', async () => {
          const result = await measureThroughput(throughputPlan, log, plan.verbose ?? false);
          if (result.skipped) throw new Error(result.skipped);
          return result;
        });
    return { comparison, sensitivitySamples, slowOverheadSamples, writeRate, sweeper, contention, throughput };
  };
  let measured: Awaited<ReturnType<typeof scenarios>>;
  try {
    measured = await scenarios();
  } finally {
    for (const project of Object.values(projects)) {
      await project.reset().catch(() => undefined);
      await project.close();
    }
    await firestore.stop();
  }
  clearInterval(sampler);
  const { comparison, sensitivitySamples, slowOverheadSamples, writeRate, sweeper, contention, throughput } = measured;

  const finished = performance.now();
  const meta: BenchMeta = {
    mode: plan.mode,
    startedAt: startedAt.toISOString(),
    finishedAt: new Date().toISOString(),
    durationMs: finished - started,
    machine: {
      cpus: cpus().length,
      node: process.version,
      platform: `${process.platform}-${process.arch}`,
      memoryGiB: Math.round(totalmem() / 2 ** 30),
      loadAverage: { mean: loads.reduce((sum, load) => sum + load, 0) / loads.length, max: Math.max(...loads) },
    },
    firestore: 'the official Cloud Firestore emulator (Google Cloud CLI component)',
    modelLatencyMs: plan.latencyMs,
    sensitivityLatencyMs: plan.sensitivity?.latencyMs ?? null,
    providerSeed: PROVIDER_SEED,
    repeats: plan.repeats,
    inputs: plan.inputs,
    faultSchedule: plan.faults.map(describeFault),
    engineOptions: { ...DEFAULT_ENGINE_OPTIONS },
    errors,
  };
  return assembleResults(meta, {
    comparison: comparison?.samples ?? null,
    sensitivity: sensitivitySamples && plan.sensitivity ? { latencyMs: plan.sensitivity.latencyMs, samples: sensitivitySamples } : null,
    slowOverhead: slowOverheadSamples && plan.slowOverhead ? { latencyMs: plan.slowOverhead.latencyMs, samples: slowOverheadSamples } : null,
    writeRate,
    sweeper,
    contention,
    throughput,
  });
}

/** Everything measured, before it is summarized. */
export interface RawResults {
  readonly comparison: readonly JobSample[] | null;
  readonly sensitivity: { readonly latencyMs: number; readonly samples: readonly JobSample[] } | null;
  readonly slowOverhead: { readonly latencyMs: number; readonly samples: readonly JobSample[] } | null;
  readonly writeRate: readonly WriteRateSample[] | null;
  readonly sweeper: { readonly samples: readonly SweeperSample[]; readonly equalityOnly: ReadonlyMap<number, number> } | null;
  readonly contention: readonly ContentionSample[] | null;
  readonly throughput: ThroughputResult | null;
}

/** Summaries, the notes on where Phaseline is not ahead and the targets, all computed from the raw samples. */
export function assembleResults(meta: BenchMeta, raw: RawResults): BenchResults {
  const durable = (samples: readonly JobSample[]) => samples.filter((sample) => sample.implementation !== 'in-memory');
  const comparison = raw.comparison ? summarizeComparison(durable(raw.comparison)) : null;
  const writeRate = raw.writeRate ? summarizeWriteRate(raw.writeRate) : null;
  const partial: Omit<BenchResults, 'notAhead' | 'targets'> = {
    meta,
    comparison: raw.comparison && comparison ? { summary: comparison, samples: raw.comparison } : null,
    overhead: raw.comparison ? summarizeOverhead(raw.comparison, meta.modelLatencyMs) : null,
    slowOverhead: raw.slowOverhead
      ? { latencyMs: raw.slowOverhead.latencyMs, summary: summarizeOverhead(raw.slowOverhead.samples, raw.slowOverhead.latencyMs), samples: raw.slowOverhead.samples }
      : null,
    sensitivity: raw.sensitivity ? { latencyMs: raw.sensitivity.latencyMs, summary: summarizeComparison(durable(raw.sensitivity.samples)), samples: raw.sensitivity.samples } : null,
    writeRate: raw.writeRate && writeRate ? { summary: writeRate, samples: raw.writeRate } : null,
    sweeper: raw.sweeper ? { summary: summarizeSweeper(raw.sweeper.samples, raw.sweeper.equalityOnly), samples: raw.sweeper.samples } : null,
    contention: raw.contention ? { summary: summarizeContention(raw.contention), samples: raw.contention } : null,
    throughput: raw.throughput ? { summary: summarizeThroughput(raw.throughput), raw: raw.throughput } : null,
    capacity: summarizeCapacity(comparison ?? undefined, writeRate ?? undefined, meta.modelLatencyMs),
  };
  return { ...partial, notAhead: notAhead(partial), targets: evaluateTargets(partial) };
}

/** The same results summarized again from their raw samples (after the summaries or notes changed). */
export function resummarize(results: BenchResults): BenchResults {
  return assembleResults(results.meta, {
    comparison: results.comparison?.samples ?? null,
    sensitivity: results.sensitivity ? { latencyMs: results.sensitivity.latencyMs, samples: results.sensitivity.samples } : null,
    // Results written before the slow-overhead scenario have none.
    slowOverhead: results.slowOverhead ? { latencyMs: results.slowOverhead.latencyMs, samples: results.slowOverhead.samples } : null,
    writeRate: results.writeRate?.samples ?? null,
    sweeper: results.sweeper
      ? { samples: results.sweeper.samples, equalityOnly: new Map(results.sweeper.summary.map((row) => [row.totalJobs, row.equalityOnlyReads])) }
      : null,
    contention: results.contention?.samples ?? null,
    throughput: results.throughput?.raw ?? null,
  });
}

export const FULL_PLAN: BenchPlan = {
  mode: 'full',
  repeats: 5,
  inputs: RESEARCH_INPUTS,
  latencyMs: 10,
  faults: FAULT_SCHEDULE,
  sensitivity: { latencyMs: 100, inputs: 1, repeats: 3 },
  // About 35 s per job either way (45 model calls, the experts in parallel): some 2.5 minutes.
  slowOverhead: { latencyMs: 1_000, inputs: 1, repeats: 2 },
  warmupJobs: 3,
  writeRate: {
    paces: [
      { intervalMs: 200, sections: 16 },
      { intervalMs: 20, sections: 50 },
    ],
    repeats: 3,
  },
  sweeper: { totals: [1_000, 10_000], expired: 10, repeats: 5 },
  contention: { claimers: [10, 50], jobs: [1, 20], repeats: 3 },
  throughput: {
    pipeline: 'canary',
    input: { text: 'The first paragraph of a short text.\n\nA second paragraph, a little longer than the first one.\n\nAnd a third.' },
    warmupJobs: 1,
    levels: [
      { concurrency: 1, jobs: 4 },
      { concurrency: 4, jobs: 8 },
      { concurrency: 16, jobs: 16 },
    ],
    timeoutMs: 180_000,
  },
  projectPrefix: 'demo-bench',
};

export const SMOKE_PLAN: BenchPlan = {
  mode: 'smoke',
  repeats: 1,
  inputs: RESEARCH_INPUTS.slice(0, 1),
  latencyMs: 5,
  faults: FAULT_SCHEDULE,
  sensitivity: null,
  slowOverhead: null,
  warmupJobs: 0,
  writeRate: { paces: [{ intervalMs: 100, sections: 6 }], repeats: 1 },
  sweeper: { totals: [100, 300], expired: 3, repeats: 1 },
  contention: { claimers: [4], jobs: [1, 2], repeats: 1 },
  throughput: null,
  projectPrefix: 'demo-bench-smoke',
};
