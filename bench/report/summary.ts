/** Turns raw samples into the figures the table, the chart and the JSON report. */
import { durableCommits, writeRoundTrips, type FirestoreCounts } from '../lib/counting';
import { groupBy, max, mean, median } from '../lib/stats';
import type { ContentionSample } from '../scenarios/contention';
import type { Implementation, JobSample } from '../scenarios/compare';
import type { SweeperSample } from '../scenarios/sweeper-cost';
import type { ThroughputResult } from '../scenarios/throughput';
import type { WriteRateSample } from '../scenarios/write-rate';

/** Per-job figures of one implementation: medians over repeats of the mean over the inputs. */
export interface ImplementationSummary {
  readonly implementation: Implementation;
  readonly modelCallsFaultFree: number;
  readonly modelCallsFaulted: number;
  /** Faulted minus fault-free, per job (same input, same repeat). */
  readonly extraModelCalls: number;
  /** With faults: calls whose exact request had been sent before in the job. */
  readonly repeatedModelCalls: number;
  readonly repeatedModelCallsFaultFree: number;
  readonly toolCallsFaultFree: number;
  readonly toolCallsFaulted: number;
  readonly extraToolCalls: number;
  /** With faults: executions of a tool call ID that had run before in the job. */
  readonly repeatedToolCalls: number;
  readonly repeatedToolCallsFaultFree: number;
  readonly wallMsFaultFree: number;
  readonly wallMsFaulted: number;
  readonly virtualWaitMsFaulted: number;
  /** Real wall time plus the virtual waits: how long the job would take to finish in production terms. */
  readonly elapsedMsFaulted: number;
  /** The virtual wait with faults by cause, and per worker lost (killed or frozen). */
  readonly waitsFaulted: Readonly<Record<string, number>>;
  readonly workersLostFaulted: number;
  /**
   * Virtual wait from a worker's loss until its job or unit ran again (Phaseline: the reclaim, by
   * a redelivered task or the sweeper; the baselines: the redelivery), per killed and per frozen
   * worker. NaN when none was lost or none came back.
   */
  readonly recoveryMsPerKilledWorker: number;
  readonly recoveryMsPerFrozenWorker: number;
  /** Who brought lost workers' work back, e.g. `crash: redelivered task ×5`. */
  readonly recoveredBy: Readonly<Record<string, number>>;
  readonly publishedFaultFree: number;
  readonly publishedFaulted: number;
  readonly readsFaultFree: number;
  readonly readsFaulted: number;
  readonly writesFaultFree: number;
  readonly writesFaulted: number;
  /** Of the writes, deletes (billed at their own price). */
  readonly deletesFaultFree: number;
  readonly deletesFaulted: number;
  /** Phaseline: writes to the job document itself. NaN for the baselines. */
  readonly jobDocumentWritesFaultFree: number;
  readonly jobDocumentWritesFaulted: number;
  /** Phaseline, fault-free: writes by document kind. Empty for the baselines. */
  readonly writesByDocumentFaultFree: Readonly<Record<string, number>>;
  /** Phaseline: function-seconds (task run time added over tasks), in ms. NaN for the baselines. */
  readonly taskMsFaultFree: number;
  readonly deliveriesFaultFree: number;
  readonly deliveriesFaulted: number;
  /** Outcomes seen with faults (e.g. completed/partial), with counts. */
  readonly outcomesFaulted: Readonly<Record<string, number>>;
  readonly zombieOutcomes: Readonly<Record<string, number>>;
  readonly samples: number;
}

function perRepeat(samples: readonly JobSample[], figure: (sample: JobSample) => number): number {
  const byRepeat = groupBy(samples, (sample) => String(sample.repeat));
  return median([...byRepeat.values()].map((group) => mean(group.map(figure))));
}

/** The mean wait of one kind of lost worker in a sample, NaN if it lost none (or none came back). */
function recoveryMs(sample: JobSample, fault: 'crash' | 'stall'): number {
  const waits = (sample.recoveries ?? []).filter((recovery) => recovery.fault === fault).map((recovery) => recovery.waitMs);
  if (waits.length === 0 || waits.some((waitMs) => waitMs === null)) return Number.NaN;
  return mean(waits as number[]);
}

/** Like perRepeat, over the samples where the figure exists. */
function perRepeatWhereMeasured(samples: readonly JobSample[], figure: (sample: JobSample) => number): number {
  const measured = samples.filter((sample) => Number.isFinite(figure(sample)));
  return measured.length === 0 ? Number.NaN : perRepeat(measured, figure);
}

function tally(values: readonly string[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const value of values) counts[value] = (counts[value] ?? 0) + 1;
  return counts;
}

export function summarizeComparison(samples: readonly JobSample[]): ImplementationSummary[] {
  const byImplementation = groupBy(samples, (sample) => sample.implementation);
  return [...byImplementation.entries()].map(([implementation, group]) => {
    const clean = group.filter((sample) => !sample.faulted);
    const faulted = group.filter((sample) => sample.faulted);
    const extra = (figure: (sample: JobSample) => number): number => {
      const pairs = faulted.flatMap((sample) => {
        const twin = clean.find((candidate) => candidate.repeat === sample.repeat && candidate.input === sample.input);
        return twin ? [{ repeat: sample.repeat, value: figure(sample) - figure(twin) }] : [];
      });
      return median([...groupBy(pairs, (pair) => String(pair.repeat)).values()].map((items) => mean(items.map((item) => item.value))));
    };
    return {
      implementation: implementation as Implementation,
      modelCallsFaultFree: perRepeat(clean, (sample) => sample.modelCalls),
      modelCallsFaulted: perRepeat(faulted, (sample) => sample.modelCalls),
      extraModelCalls: extra((sample) => sample.modelCalls),
      repeatedModelCalls: perRepeat(faulted, (sample) => sample.repeatedModelCalls),
      repeatedModelCallsFaultFree: perRepeat(clean, (sample) => sample.repeatedModelCalls),
      toolCallsFaultFree: perRepeat(clean, (sample) => sample.toolCalls),
      toolCallsFaulted: perRepeat(faulted, (sample) => sample.toolCalls),
      extraToolCalls: extra((sample) => sample.toolCalls),
      repeatedToolCalls: perRepeat(faulted, (sample) => sample.repeatedToolCalls),
      repeatedToolCallsFaultFree: perRepeat(clean, (sample) => sample.repeatedToolCalls),
      wallMsFaultFree: perRepeat(clean, (sample) => sample.wallMs),
      wallMsFaulted: perRepeat(faulted, (sample) => sample.wallMs),
      virtualWaitMsFaulted: perRepeat(faulted, (sample) => sample.virtualWaitMs),
      elapsedMsFaulted: perRepeat(faulted, (sample) => sample.wallMs + sample.virtualWaitMs),
      waitsFaulted: Object.fromEntries(
        [...new Set(faulted.flatMap((sample) => Object.keys(sample.waits)))].map((cause) => [cause, perRepeat(faulted, (sample) => sample.waits[cause] ?? 0)]),
      ),
      workersLostFaulted: perRepeat(faulted, (sample) => sample.workersLost),
      recoveryMsPerKilledWorker: perRepeatWhereMeasured(faulted, (sample) => recoveryMs(sample, 'crash')),
      recoveryMsPerFrozenWorker: perRepeatWhereMeasured(faulted, (sample) => recoveryMs(sample, 'stall')),
      recoveredBy: tally(faulted.flatMap((sample) => (sample.recoveries ?? []).map((recovery) => `${recovery.fault === 'crash' ? 'killed' : 'frozen'}: ${recovery.by ?? 'never'}`))),
      publishedFaultFree: perRepeat(clean, (sample) => sample.published),
      publishedFaulted: perRepeat(faulted, (sample) => sample.published),
      readsFaultFree: perRepeat(clean, (sample) => sample.reads),
      readsFaulted: perRepeat(faulted, (sample) => sample.reads),
      writesFaultFree: perRepeat(clean, (sample) => sample.writes),
      writesFaulted: perRepeat(faulted, (sample) => sample.writes),
      deletesFaultFree: perRepeatWhereMeasured(clean, (sample) => sample.counts?.deletes ?? Number.NaN),
      deletesFaulted: perRepeatWhereMeasured(faulted, (sample) => sample.counts?.deletes ?? Number.NaN),
      jobDocumentWritesFaultFree: perRepeatWhereMeasured(clean, (sample) => (sample.writesByDocument ? (sample.writesByDocument.job ?? 0) : Number.NaN)),
      jobDocumentWritesFaulted: perRepeatWhereMeasured(faulted, (sample) => (sample.writesByDocument ? (sample.writesByDocument.job ?? 0) : Number.NaN)),
      writesByDocumentFaultFree: Object.fromEntries(
        [...new Set(clean.flatMap((sample) => Object.keys(sample.writesByDocument ?? {})))].map((kind) => [kind, perRepeat(clean, (sample) => sample.writesByDocument?.[kind] ?? 0)]),
      ),
      taskMsFaultFree: perRepeatWhereMeasured(clean, (sample) => sample.taskMs ?? Number.NaN),
      deliveriesFaultFree: perRepeat(clean, (sample) => sample.deliveries),
      deliveriesFaulted: perRepeat(faulted, (sample) => sample.deliveries),
      outcomesFaulted: tally(faulted.map((sample) => `${sample.status}/${sample.outcome ?? '-'}`)),
      zombieOutcomes: tally(faulted.flatMap((sample) => sample.zombieOutcomes)),
      samples: group.length,
    };
  });
}

export interface OverheadSummary {
  /** Model latency of the runs, in ms. */
  readonly latencyMs: number;
  readonly inMemoryWallMs: number;
  readonly phaselineWallMs: number;
  /** Median over repeats of (Phaseline wall time / in-process wall time), both fault-free, same repeat. */
  readonly wallTimeRatio: number;
  readonly ratios: readonly number[];
  readonly sectionsPerJob: number;
  /** Durable writes: every write but the drafts, which are a view of the text in flight (see draftWritesPerSection). */
  readonly writesPerSection: number;
  /** Writes of drafts (jobs/{id}/drafts): what showing the text as it is written adds. NaN where not recorded. */
  readonly draftWritesPerSection: number;
  readonly readsPerSection: number;
  readonly transactionsPerSection: number;
  /** Calls of transaction update functions (transactions plus the SDK's retries) per section. */
  readonly transactionAttemptsPerSection: number;
  /** Commits that wrote something (durable writes; a commit may write several documents) per section. */
  readonly commitsPerSection: number;
  /** Every RPC (gets, queries, commits, rollbacks) per section. */
  readonly roundTripsPerSection: number;
  /** Round trips spent on durable writes (lib/counting.ts writeRoundTrips) per section. */
  readonly writeRoundTripsPerSection: number;
  /** Write round trips per durable write: 1 when every durable write is one round trip. */
  readonly roundTripsPerDurableWrite: number;
  /** (Phaseline − in-process) wall time per agent section. */
  readonly addedMsPerSection: number;
  /** Transcript bytes per agent section: as written (append-only log), and the whole transcript rewritten at each save. */
  readonly transcriptBytesPerSection: { readonly appendOnly: number; readonly wholeRewrite: number };
  /** Billed reads and writes per agent section by document kind (`job`, a subcollection of the job, or a collection outside it); empty when not recorded. */
  readonly readsPerSectionByDocument: Readonly<Record<string, number>>;
  readonly writesPerSectionByDocument: Readonly<Record<string, number>>;
}

/** Per agent section, by document kind, from samples that recorded the breakdown (median over repeats). */
function perSectionByDocument(samples: readonly JobSample[], breakdown: (sample: JobSample) => Readonly<Record<string, number>> | null | undefined): Record<string, number> {
  const recorded = samples.filter((sample) => breakdown(sample));
  const kinds = [...new Set(recorded.flatMap((sample) => Object.keys(breakdown(sample) ?? {})))];
  return Object.fromEntries(kinds.map((kind) => [kind, perRepeat(recorded, (sample) => (breakdown(sample)?.[kind] ?? 0) / sample.sections)]));
}

/** Drafts are written one document per commit, outside any transaction: their commits are left out of the durable-write figures. */
function draftCommits(sample: JobSample): number {
  return sample.writesByDocument?.drafts ?? 0;
}

/** A count that results written before it was measured lack: NaN then. */
function counted(sample: JobSample, figure: (counts: FirestoreCounts) => number): number {
  const value = sample.counts ? figure(sample.counts) : Number.NaN;
  return typeof value === 'number' ? value : Number.NaN;
}

export function summarizeOverhead(samples: readonly JobSample[], latencyMs: number): OverheadSummary | null {
  const memory = samples.filter((sample) => sample.implementation === 'in-memory');
  const phaseline = samples.filter((sample) => sample.implementation === 'phaseline' && !sample.faulted);
  if (memory.length === 0 || phaseline.length === 0) return null;
  const repeats = [...new Set(memory.map((sample) => sample.repeat))];
  const ratios = repeats.flatMap((repeat) => {
    const ours = phaseline.filter((sample) => sample.repeat === repeat);
    const theirs = memory.filter((sample) => sample.repeat === repeat);
    return ours.length > 0 && theirs.length > 0 ? [mean(ours.map((sample) => sample.wallMs)) / mean(theirs.map((sample) => sample.wallMs))] : [];
  });
  const sections = mean(phaseline.map((sample) => sample.sections));
  const inMemoryWallMs = perRepeat(memory, (sample) => sample.wallMs);
  const phaselineWallMs = perRepeat(phaseline, (sample) => sample.wallMs);
  const perSection = (figure: (counts: FirestoreCounts) => number): number => perRepeat(phaseline, (sample) => counted(sample, figure) / sample.sections);
  const perSectionDurable = (figure: (counts: FirestoreCounts) => number): number => perRepeat(phaseline, (sample) => (counted(sample, figure) - draftCommits(sample)) / sample.sections);
  return {
    latencyMs,
    inMemoryWallMs,
    phaselineWallMs,
    wallTimeRatio: median(ratios),
    ratios,
    sectionsPerJob: sections,
    writesPerSection: perRepeat(phaseline, (sample) => (sample.writes - (sample.writesByDocument?.drafts ?? 0)) / sample.sections),
    draftWritesPerSection: perRepeat(phaseline, (sample) => (sample.writesByDocument ? (sample.writesByDocument.drafts ?? 0) / sample.sections : Number.NaN)),
    readsPerSection: perRepeat(phaseline, (sample) => sample.reads / sample.sections),
    transactionsPerSection: perRepeat(phaseline, (sample) => (sample.counts?.transactions ?? 0) / sample.sections),
    transactionAttemptsPerSection: perSection((counts) => counts.transactionAttempts),
    commitsPerSection: perSectionDurable(durableCommits),
    roundTripsPerSection: perSection((counts) => counts.rpcs),
    writeRoundTripsPerSection: perSectionDurable(writeRoundTrips),
    roundTripsPerDurableWrite: perRepeat(phaseline, (sample) => (counted(sample, writeRoundTrips) - draftCommits(sample)) / (counted(sample, durableCommits) - draftCommits(sample))),
    addedMsPerSection: (phaselineWallMs - inMemoryWallMs) / sections,
    transcriptBytesPerSection: {
      appendOnly: perRepeat(phaseline, (sample) => (sample.transcriptBytes ? sample.transcriptBytes.appendOnly / sample.sections : Number.NaN)),
      wholeRewrite: perRepeat(phaseline, (sample) => (sample.transcriptBytes ? sample.transcriptBytes.wholeRewrite / sample.sections : Number.NaN)),
    },
    readsPerSectionByDocument: perSectionByDocument(phaseline, (sample) => sample.readsByDocument),
    writesPerSectionByDocument: perSectionByDocument(phaseline, (sample) => sample.writesByDocument),
  };
}

export interface WriteRateSummary {
  readonly intervalMs: number;
  readonly sections: number;
  readonly sectionsPerSecond: number;
  readonly phaseMs: number;
  readonly jobWrites: number;
  readonly jobWritesPerSecond: number;
  /** Writes between the claim and the hand-off: the flusher's. */
  readonly progressWrites: number;
  /** Progress writes per second between the first and the last of them: the sustained rate. */
  readonly progressWritesPerSecond: number;
  /** The shortest gap between two progress writes, over the repeats. */
  readonly minProgressGapMs: number;
  /** Worst over the repeats. */
  readonly maxJobWritesInOneSecond: number;
  readonly uncoalescedJobWrites: number;
  /** The write times of the repeat with the median write count, for the chart. */
  readonly exampleOffsetsMs: readonly number[];
}

/** The flusher's writes: every job-document write of the step but the first (the claim) and the last (the hand-off). */
function progressOffsets(sample: WriteRateSample): readonly number[] {
  return sample.writeOffsetsMs.slice(1, -1);
}

function progressRate(sample: WriteRateSample): number {
  const offsets = progressOffsets(sample);
  const first = offsets[0];
  const last = offsets.at(-1);
  return first === undefined || last === undefined || last === first ? Number.NaN : (offsets.length - 1) / ((last - first) / 1000);
}

function minGap(offsets: readonly number[]): number {
  let gap = Number.POSITIVE_INFINITY;
  for (let index = 1; index < offsets.length; index += 1) gap = Math.min(gap, (offsets[index] as number) - (offsets[index - 1] as number));
  return gap;
}

export function summarizeWriteRate(samples: readonly WriteRateSample[]): WriteRateSummary[] {
  return [...groupBy(samples, (sample) => String(sample.intervalMs)).values()].map((group) => {
    const sorted = [...group].sort((a, b) => a.jobWrites - b.jobWrites);
    const example = sorted[Math.floor(sorted.length / 2)] as WriteRateSample;
    const rates = group.map(progressRate).filter((rate) => Number.isFinite(rate));
    return {
      progressWrites: median(group.map((sample) => progressOffsets(sample).length)),
      progressWritesPerSecond: median(rates),
      minProgressGapMs: Math.min(...group.map((sample) => minGap(progressOffsets(sample)))),
      intervalMs: example.intervalMs,
      sections: example.sections,
      sectionsPerSecond: median(group.map((sample) => sample.sectionsPerSecond)),
      phaseMs: median(group.map((sample) => sample.phaseMs)),
      jobWrites: median(group.map((sample) => sample.jobWrites)),
      jobWritesPerSecond: median(group.map((sample) => sample.jobWritesPerSecond)),
      maxJobWritesInOneSecond: max(group.map((sample) => sample.maxJobWritesInOneSecond)),
      uncoalescedJobWrites: example.uncoalescedJobWrites,
      exampleOffsetsMs: example.writeOffsetsMs,
    };
  });
}

export interface SweeperSummary {
  readonly totalJobs: number;
  readonly expired: number;
  readonly msPerSweep: number;
  readonly documentsRead: number;
  readonly billedReads: number;
  readonly writes: number;
  readonly reclaimed: number;
  /** What a sweep would read without the range index: every running job, filtered in code. */
  readonly equalityOnlyReads: number;
}

export function summarizeSweeper(samples: readonly SweeperSample[], equalityOnly: ReadonlyMap<number, number>): SweeperSummary[] {
  return [...groupBy(samples, (sample) => String(sample.totalJobs)).values()].map((group) => {
    const first = group[0] as SweeperSample;
    return {
      totalJobs: first.totalJobs,
      expired: first.expired,
      msPerSweep: median(group.map((sample) => sample.ms)),
      documentsRead: median(group.map((sample) => sample.documentsRead)),
      billedReads: median(group.map((sample) => sample.billedReads)),
      writes: median(group.map((sample) => sample.writes)),
      reclaimed: median(group.map((sample) => sample.reclaimed)),
      equalityOnlyReads: equalityOnly.get(first.totalJobs) ?? Number.NaN,
    };
  });
}

export interface ContentionSummary {
  readonly claimers: number;
  readonly jobs: number;
  readonly winners: number;
  readonly expectedWinners: number;
  readonly maxWinnersPerJob: number;
  readonly retriedAttempts: number;
  readonly abortedRpcs: number;
  readonly errors: number;
  readonly settleMs: number;
}

export function summarizeContention(samples: readonly ContentionSample[]): ContentionSummary[] {
  return [...groupBy(samples, (sample) => `${sample.claimers}/${sample.jobs}`).values()].map((group) => {
    const first = group[0] as ContentionSample;
    return {
      claimers: first.claimers,
      jobs: first.jobs,
      winners: median(group.map((sample) => sample.winners)),
      expectedWinners: Math.min(first.claimers, first.jobs),
      maxWinnersPerJob: max(group.map((sample) => sample.maxWinnersPerJob)),
      retriedAttempts: median(group.map((sample) => sample.retriedAttempts)),
      abortedRpcs: median(group.map((sample) => sample.abortedRpcs)),
      errors: group.reduce((sum, sample) => sum + sample.errors, 0),
      settleMs: median(group.map((sample) => sample.settleMs)),
    };
  });
}

export interface ThroughputSummary {
  readonly concurrency: number;
  readonly jobs: number;
  readonly completed: number;
  readonly jobsPerMinute: number;
  readonly queuedMsMedian: number;
  readonly queuedMsMax: number;
  readonly endToEndMsMedian: number;
}

export function summarizeThroughput(result: ThroughputResult | null): ThroughputSummary[] {
  if (!result) return [];
  return result.levels.map((level) => {
    const queued = level.jobs.flatMap((job) => (job.queuedMs === null ? [] : [job.queuedMs]));
    return {
      concurrency: level.concurrency,
      jobs: level.jobs.length,
      completed: level.jobs.filter((job) => job.status === 'completed').length,
      jobsPerMinute: level.jobsPerMinute,
      queuedMsMedian: median(queued),
      queuedMsMax: max(queued),
      endToEndMsMedian: median(level.jobs.map((job) => job.endToEndMs)),
    };
  });
}

/**
 * Where Phaseline's wall time with faults would meet a baseline's, extrapolating linearly in the
 * model latency from two runs (the same input at both latencies). Null when the lines do not cross
 * at a positive latency.
 */
export function breakEvenLatencyMs(
  low: readonly JobSample[],
  lowLatencyMs: number,
  high: readonly JobSample[],
  highLatencyMs: number,
  baseline: Implementation,
): number | null {
  const inputs = new Set(high.map((sample) => sample.input));
  const wall = (samples: readonly JobSample[], implementation: Implementation): number =>
    perRepeat(samples.filter((sample) => sample.faulted && sample.implementation === implementation && inputs.has(sample.input)), (sample) => sample.wallMs);
  const line = (implementation: Implementation) => {
    const atLow = wall(low, implementation);
    const slope = (wall(high, implementation) - atLow) / (highLatencyMs - lowLatencyMs);
    return { slope, intercept: atLow - slope * lowLatencyMs };
  };
  const ours = line('phaseline');
  const theirs = line(baseline);
  if (!(theirs.slope > ours.slope)) return null;
  const latency = (ours.intercept - theirs.intercept) / (theirs.slope - ours.slope);
  return Number.isFinite(latency) && latency > 0 ? latency : null;
}
