/**
 * Phaseline against the two baselines on the same research jobs, with and without the fault
 * schedule, and the same phases in-process with no durability (the overhead yardstick).
 *
 * Each repeat runs every implementation (the order rotates between repeats) on every input,
 * fault-free and then with faults. Figures per job: model and tool calls (and the extra ones a
 * fault caused: the faulted run minus the fault-free run of the same implementation, input and
 * repeat), real wall time, virtual recovery wait (in all, by cause, and per lost worker), published
 * results, Firestore reads and writes (Phaseline's also by document kind).
 *
 * With `lostTaskVariant`, Phaseline also runs every faulted job with the killed worker's task
 * lost (never redelivered), so that recovery rests on the sweeper alone: the "before" figure
 * next to the redelivered takeover, measured in the same run.
 *
 * `runOverhead` runs only the overhead pair (Phaseline and in-process, fault-free), for model
 * latencies too slow to run the whole comparison at (1 s a call).
 */
import { ManualClock } from '../../functions/src/core/clock';
import { resolveEngineOptions } from '../../functions/src/core/options';
import type { ResearchInput } from '../../functions/src/pipelines/research';
import { jobPath } from '../../functions/src/store/paths';
import { firestoreCircuit } from '../../functions/src/store/provider-circuit';
import { groupBySection, replaySaves } from '../../functions/src/store/transcript-log';
import { BaselineRunner, type BaselineKind } from '../lib/baselines';
import { billedReads, type FirestoreCounts } from '../lib/counting';
import type { Fault, FaultEvent } from '../lib/faults';
import type { ProjectClients } from '../lib/firestore';
import { PhaselineDriver } from '../lib/phaseline-driver';
import { agentSections, closedCircuit, researchKit } from '../lib/workload';

export const IMPLEMENTATIONS = ['phaseline', 'whole-job', 'phase-checkpoints'] as const;
/** `phaseline-lost-task`: Phaseline with the killed worker's task never redelivered (faulted runs only). */
export type Implementation = (typeof IMPLEMENTATIONS)[number] | 'in-memory' | 'phaseline-lost-task';

/** A worker a fault took, and the virtual wait until its work ran again. */
export interface SampleRecovery {
  readonly fault: 'crash' | 'stall';
  /** Null when it never came back (the job ended otherwise). */
  readonly waitMs: number | null;
  /** Phaseline: who reclaimed the work (a redelivered task or the sweeper); the baselines: the redelivery. */
  readonly by: string | null;
}

export interface JobSample {
  readonly implementation: Implementation;
  readonly faulted: boolean;
  readonly repeat: number;
  readonly input: number;
  readonly sections: number;
  readonly status: string;
  readonly outcome: string | null;
  readonly wallMs: number;
  readonly virtualWaitMs: number;
  readonly waits: Readonly<Record<string, number>>;
  readonly modelCalls: number;
  /** Model calls whose exact request had been sent before in this job. */
  readonly repeatedModelCalls: number;
  readonly toolCalls: number;
  /** Tool executions of a call ID that had run before in this job. */
  readonly repeatedToolCalls: number;
  readonly published: number;
  readonly reads: number;
  readonly writes: number;
  readonly counts: FirestoreCounts | null;
  /** Tasks run (Phaseline) or task deliveries (baselines). */
  readonly deliveries: number;
  readonly workersLost: number;
  /** Absent in results written before it was measured. */
  readonly recoveries?: readonly SampleRecovery[];
  /** Phaseline: real time its tasks ran, added over tasks (function-seconds); null for the baselines. */
  readonly taskMs?: number | null;
  /** Phaseline: writes by document kind (`job`, a subcollection of the job, or a top-level collection); null for the baselines. */
  readonly writesByDocument?: Readonly<Record<string, number>> | null;
  /** Billed reads by the document (or the collection of an empty query) they were of, as `writesByDocument`. */
  readonly readsByDocument?: Readonly<Record<string, number>> | null;
  /** Transcript bytes the job wrote (append-only log), and what rewriting the whole transcript at each of the same saves would have written. */
  readonly transcriptBytes?: { readonly appendOnly: number; readonly wholeRewrite: number } | null;
  readonly zombieOutcomes: readonly string[];
  readonly faultEvents: readonly FaultEvent[];
}

export interface CompareConfig {
  readonly repeats: number;
  readonly inputs: readonly ResearchInput[];
  readonly faults: readonly Fault[];
  readonly latencyMs: number;
  readonly phaselineProject: ProjectClients;
  readonly baselineProject: ProjectClients;
  /** Also run Phaseline's faulted jobs with the killed worker's task lost (sweeper-only recovery). */
  readonly lostTaskVariant?: boolean;
  readonly log?: (line: string) => void;
}

function repeatedExecutions(byCallId: Readonly<Record<string, number>>): number {
  return Object.values(byCallId).reduce((sum, count) => sum + Math.max(0, count - 1), 0);
}

async function publishedCount(project: ProjectClients, jobId: string): Promise<number> {
  return (await project.inspector.collection(`jobs/${jobId}/results`).get()).size;
}

/** Which document a write went to, as seen from job `jobId`: `job`, the job's subcollection, or a collection outside the job. */
function documentKind(path: string, jobId: string): string {
  const job = jobPath(jobId);
  if (path === job) return 'job';
  if (path.startsWith(`${job}/`)) return path.slice(job.length + 1).split('/')[0] ?? '?';
  const [collection] = path.split('/');
  return `${collection ?? '?'} (outside the job)`;
}

/**
 * Bytes of the job's transcript documents as JSON (an estimate of what Firestore stores, close
 * enough to compare two schemes): the saves as written, append-only, and the whole transcript as
 * it stood after each of the same saves, which is what one document per section rewritten on
 * every save would have written. Read through the uncounted client.
 */
async function transcriptBytes(project: ProjectClients, jobId: string): Promise<{ appendOnly: number; wholeRewrite: number }> {
  const snapshot = await project.inspector.collection(`${jobPath(jobId)}/transcripts`).get();
  const documents = snapshot.docs.map((doc) => ({ id: doc.id, data: doc.data() }));
  let appendOnly = 0;
  let wholeRewrite = 0;
  for (const document of documents) appendOnly += JSON.stringify(document.data).length;
  for (const saves of groupBySection(documents).values()) {
    const ordered = [...saves].sort((a, b) => a.id.localeCompare(b.id));
    ordered.forEach((save, index) => {
      const { phase, unit, id, epoch, savedAtMs } = save.data as Record<string, unknown>;
      wholeRewrite += JSON.stringify({ phase, unit, id, transcript: replaySaves(ordered.slice(0, index + 1)).transcript, epoch, savedAtMs }).length;
    });
  }
  return { appendOnly, wholeRewrite };
}

async function runPhaseline(config: CompareConfig, driver: PhaselineDriver, input: ResearchInput, faulted: boolean): Promise<Omit<JobSample, 'repeat' | 'input' | 'implementation' | 'faulted'>> {
  const project = config.phaselineProject;
  const kit = researchKit(driver.clock, faulted ? config.faults : [], firestoreCircuit(project.db, 'offline'), config.latencyMs);
  project.counter.reset();
  project.counter.recordWrites = true;
  let run: Awaited<ReturnType<PhaselineDriver['runJob']>>;
  try {
    run = await driver.runJob(kit.registry, 'research', input, { wakeFrozen: () => kit.provider.wakeFrozen() });
  } finally {
    project.counter.recordWrites = false;
  }
  const counts = project.counter.snapshot();
  const writesByDocument: Record<string, number> = {};
  for (const write of project.counter.writeLog) {
    const kind = documentKind(write.path, run.jobId);
    writesByDocument[kind] = (writesByDocument[kind] ?? 0) + 1;
  }
  const readsByDocument: Record<string, number> = {};
  for (const path of project.counter.readLog) {
    const kind = documentKind(path, run.jobId);
    readsByDocument[kind] = (readsByDocument[kind] ?? 0) + 1;
  }
  return {
    sections: agentSections(input),
    status: run.status,
    outcome: run.outcome,
    wallMs: run.wallMs,
    virtualWaitMs: run.virtualWaitMs,
    waits: run.waits,
    modelCalls: kit.provider.calls,
    repeatedModelCalls: kit.provider.repeatedCalls,
    toolCalls: kit.toolbox.stats().total,
    repeatedToolCalls: repeatedExecutions(kit.toolbox.stats().byCallId),
    published: await publishedCount(project, run.jobId),
    reads: billedReads(counts),
    writes: counts.writes,
    counts,
    deliveries: run.tasks,
    workersLost: run.workersLost,
    recoveries: run.recoveries.map((recovery) => ({ fault: recovery.fault, waitMs: recovery.waitMs, by: recovery.by })),
    taskMs: run.taskMs,
    writesByDocument,
    readsByDocument,
    transcriptBytes: await transcriptBytes(project, run.jobId),
    zombieOutcomes: run.zombieOutcomes,
    faultEvents: [...kit.provider.events],
  };
}

async function runBaseline(config: CompareConfig, kind: BaselineKind, input: ResearchInput, faulted: boolean): Promise<Omit<JobSample, 'repeat' | 'input' | 'implementation' | 'faulted'>> {
  const project = kind === 'in-memory' ? null : config.baselineProject;
  const clock = new ManualClock();
  const kit = researchKit(clock, faulted ? config.faults : [], closedCircuit, config.latencyMs);
  const runner = new BaselineRunner(kind, project, clock);
  project?.counter.reset();
  const run = await runner.runJob(kit.pipeline, input, { wakeFrozen: () => kit.provider.wakeFrozen() });
  const counts = project ? project.counter.snapshot() : null;
  return {
    sections: agentSections(input),
    status: run.status,
    outcome: run.outcome,
    wallMs: run.wallMs,
    virtualWaitMs: run.virtualWaitMs,
    waits: run.waits,
    modelCalls: kit.provider.calls,
    repeatedModelCalls: kit.provider.repeatedCalls,
    toolCalls: kit.toolbox.stats().total,
    repeatedToolCalls: repeatedExecutions(kit.toolbox.stats().byCallId),
    published: project ? await publishedCount(project, run.jobId) : run.status === 'completed' ? 1 : 0,
    reads: counts ? billedReads(counts) : 0,
    writes: counts ? counts.writes : 0,
    counts,
    deliveries: run.attempts,
    workersLost: run.workersLost,
    recoveries: run.recoveries.map((recovery) => ({ ...recovery, by: 'redelivery' })),
    taskMs: null,
    writesByDocument: null,
    readsByDocument: null,
    zombieOutcomes: run.zombieOutcomes,
    faultEvents: [...kit.provider.events],
  };
}

export async function runComparison(config: CompareConfig): Promise<JobSample[]> {
  const samples: JobSample[] = [];
  const log = config.log ?? (() => undefined);
  for (let repeat = 0; repeat < config.repeats; repeat += 1) {
    await config.phaselineProject.reset();
    await config.baselineProject.reset();
    const driver = new PhaselineDriver(config.phaselineProject, resolveEngineOptions());
    const lostTaskDriver = new PhaselineDriver(config.phaselineProject, resolveEngineOptions(), { killedTasks: 'lost' });
    // Rotate the order so that no implementation always runs first (cold caches) or last.
    const order: Implementation[] = [
      ...IMPLEMENTATIONS.slice(repeat % 3),
      ...IMPLEMENTATIONS.slice(0, repeat % 3),
      'in-memory',
      ...(config.lostTaskVariant ? (['phaseline-lost-task'] as const) : []),
    ];
    for (const implementation of order) {
      const runs = implementation === 'in-memory' ? [false] : implementation === 'phaseline-lost-task' ? [true] : [false, true];
      for (const faulted of runs) {
        for (const [index, input] of config.inputs.entries()) {
          const sample =
            implementation === 'phaseline'
              ? await runPhaseline(config, driver, input, faulted)
              : implementation === 'phaseline-lost-task'
                ? await runPhaseline(config, lostTaskDriver, input, faulted)
                : await runBaseline(config, implementation, input, faulted);
          samples.push({ implementation, faulted, repeat, input: index, ...sample });
          log(
            `  compare r${repeat} ${implementation}${faulted ? ' +faults' : ''} job ${index}: ${sample.status}/${sample.outcome ?? '-'} ` +
              `${Math.round(sample.wallMs)} ms, ${sample.modelCalls} model calls (${sample.repeatedModelCalls} repeated), ${sample.published} published, ${sample.reads} reads, ${sample.writes} writes`,
          );
        }
      }
    }
  }
  return samples;
}

export type OverheadConfig = Pick<CompareConfig, 'repeats' | 'inputs' | 'latencyMs' | 'phaselineProject' | 'log'>;

/**
 * Phaseline and the same phases in-process with no durability, fault-free, on the same inputs:
 * the durability overhead alone. The order alternates between repeats, so that neither always
 * runs first.
 */
export async function runOverhead(config: OverheadConfig): Promise<JobSample[]> {
  const samples: JobSample[] = [];
  const log = config.log ?? (() => undefined);
  // No faults, and the in-process run touches no project: the baselines' project is never used.
  const compare: CompareConfig = { ...config, faults: [], baselineProject: config.phaselineProject };
  for (let repeat = 0; repeat < config.repeats; repeat += 1) {
    await config.phaselineProject.reset();
    const driver = new PhaselineDriver(config.phaselineProject, resolveEngineOptions());
    const order: readonly ('phaseline' | 'in-memory')[] = repeat % 2 === 0 ? ['in-memory', 'phaseline'] : ['phaseline', 'in-memory'];
    for (const implementation of order) {
      for (const [index, input] of config.inputs.entries()) {
        const sample = implementation === 'phaseline' ? await runPhaseline(compare, driver, input, false) : await runBaseline(compare, 'in-memory', input, false);
        samples.push({ implementation, faulted: false, repeat, input: index, ...sample });
        log(`  overhead at ${config.latencyMs} ms/call r${repeat} ${implementation} job ${index}: ${sample.status}/${sample.outcome ?? '-'} ${Math.round(sample.wallMs)} ms, ${sample.modelCalls} model calls`);
      }
    }
  }
  return samples;
}
