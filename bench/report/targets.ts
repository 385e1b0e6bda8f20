/**
 * The engine's targets (issue 12), each set against this run's figures. Whether a target is met is
 * worked out here from the summaries, never written down: a target whose figure this run did not
 * measure, or measured under other conditions than the target names (another model latency, fewer
 * claimers, other job counts: the smoke plan), is neither met nor missed (`met: null`), and its
 * measured cell says why.
 */
import { addedPercent, fmt } from './markdown';
import type { BenchResults } from './results';
import type { SectionKey } from './sections';
import type { OverheadSummary } from './summary';

/** The thresholds, as the issue states them. */
export const TARGETS = {
  readsPerSection: 2,
  writesPerSection: 10,
  /** Round trips per durable write: every durable write one round trip. */
  roundTripsPerDurableWrite: 1,
  overheadLatencyMs: 10,
  overheadRatio: 3,
  slowOverheadLatencyMs: 1_000,
  /** At most 1 % more wall time than in-process: the saves the section runner can overlap run behind the model call. */
  slowOverheadFraction: 0.01,
  recoveryMsPerKilledWorker: 30_000,
  claimers: 50,
  /** "About one a second": the flusher's floor is 1 s between writes; 5 % is left for timer jitter. */
  sustainedJobWritesPerSecond: 1.05,
  sweeperJobs: [1_000, 10_000] as const,
} as const;

export interface TargetCheck {
  readonly target: string;
  /** The figure, with what it is made of. */
  readonly measured: string;
  /** Worked out from the figure; null when not measured in this run or under other conditions than the target's. */
  readonly met: boolean | null;
  /** The section of results.md the figure comes from. */
  readonly section: SectionKey;
}

type Inputs = Pick<BenchResults, 'comparison' | 'overhead' | 'slowOverhead' | 'writeRate' | 'sweeper' | 'contention'>;

const NOT_MEASURED = 'not measured in this run';

/** A check whose figure may be missing (NaN: a scenario that did not run, or results from before it was counted). */
function check(target: string, section: SectionKey, value: number | undefined, measured: (value: number) => string, met: (value: number) => boolean): TargetCheck {
  if (value === undefined || !Number.isFinite(value)) return { target, section, measured: NOT_MEASURED, met: null };
  return { target, section, measured: measured(value), met: met(value) };
}

function overheadCheck(target: string, overhead: OverheadSummary | null | undefined, latencyMs: number, met: (ratio: number) => boolean): TargetCheck {
  if (!overhead || !Number.isFinite(overhead.wallTimeRatio)) return { target, section: 'overhead', measured: NOT_MEASURED, met: null };
  const figure =
    `×${fmt(overhead.wallTimeRatio, 3)}, ${addedPercent(overhead.wallTimeRatio)} ` +
    `(${fmt(overhead.phaselineWallMs)} ms against ${fmt(overhead.inMemoryWallMs)} ms per job; ${fmt(overhead.addedMsPerSection)} ms per agent section)`;
  if (overhead.latencyMs !== latencyMs) return { target, section: 'overhead', measured: `${figure} at ${fmt(overhead.latencyMs)} ms per model call, not ${fmt(latencyMs)} ms`, met: null };
  return { target, section: 'overhead', measured: figure, met: met(overhead.wallTimeRatio) };
}

export function evaluateTargets(results: Inputs): TargetCheck[] {
  const overhead = results.overhead;
  const checks: TargetCheck[] = [];

  checks.push(
    check(
      `Document reads per agent section: at most ${TARGETS.readsPerSection}`,
      'overhead',
      overhead?.readsPerSection,
      (value) => `${fmt(value, 1)} (billed reads, fault-free)`,
      (value) => value <= TARGETS.readsPerSection,
    ),
    check(
      `Document writes per agent section: at most ${TARGETS.writesPerSection}`,
      'overhead',
      overhead?.writesPerSection,
      (value) => `${fmt(value, 1)} (fault-free)`,
      (value) => value <= TARGETS.writesPerSection,
    ),
    check(
      'Every durable write one round trip',
      'overhead',
      overhead?.roundTripsPerDurableWrite,
      (value) =>
        `${fmt(value, 2)} round trips per durable write; per agent section: ${fmt(overhead?.commitsPerSection ?? Number.NaN, 1)} commits that wrote, ` +
        `${fmt(overhead?.transactionsPerSection ?? Number.NaN, 1)} transactions (${fmt(overhead?.transactionAttemptsPerSection ?? Number.NaN, 1)} attempts), ` +
        `${fmt(overhead?.writeRoundTripsPerSection ?? Number.NaN, 1)} round trips for writes, ${fmt(overhead?.roundTripsPerSection ?? Number.NaN, 1)} in all`,
      (value) => value <= TARGETS.roundTripsPerDurableWrite,
    ),
    overheadCheck(
      `Durability overhead at ${fmt(TARGETS.overheadLatencyMs)} ms per model call: at most ×${fmt(TARGETS.overheadRatio)} the in-process wall time`,
      overhead,
      TARGETS.overheadLatencyMs,
      (ratio) => ratio <= TARGETS.overheadRatio,
    ),
    overheadCheck(
      `Durability overhead at ${fmt(TARGETS.slowOverheadLatencyMs / 1000)} s per model call: at most ${fmt(TARGETS.slowOverheadFraction * 100)} %`,
      results.slowOverhead?.summary,
      TARGETS.slowOverheadLatencyMs,
      (ratio) => ratio - 1 <= TARGETS.slowOverheadFraction,
    ),
  );

  const phaseline = results.comparison?.summary.find((row) => row.implementation === 'phaseline');
  const killedBy = Object.entries(phaseline?.recoveredBy ?? {})
    .filter(([key]) => key.startsWith('killed: '))
    .map(([key, count]) => `${key.slice('killed: '.length)} ×${count}`)
    .join(', ');
  checks.push(
    check(
      `Recovery wait per killed worker: at most ${fmt(TARGETS.recoveryMsPerKilledWorker / 1000)} s`,
      'comparison',
      phaseline?.recoveryMsPerKilledWorker,
      (value) => `${fmt(value / 1000)} s (virtual${killedBy ? `; ${killedBy}` : ''})`,
      (value) => value <= TARGETS.recoveryMsPerKilledWorker,
    ),
  );

  const contention = results.contention?.summary ?? [];
  const atTarget = contention.filter((row) => row.claimers === TARGETS.claimers);
  const claimTarget = `One winner per claim at ${fmt(TARGETS.claimers)} claimers`;
  const claims = (rows: typeof contention): string =>
    rows.map((row) => `${fmt(row.claimers)} claimers on ${fmt(row.jobs)} job${row.jobs === 1 ? '' : 's'}: ${fmt(row.winners)} winner${row.winners === 1 ? '' : 's'} (${fmt(row.expectedWinners)} expected), at most ${fmt(row.maxWinnersPerJob)} per job, ${fmt(row.errors)} errors`).join('; ');
  if (atTarget.length > 0) {
    checks.push({
      target: claimTarget,
      section: 'contention',
      measured: claims(atTarget),
      met: atTarget.every((row) => row.maxWinnersPerJob === 1 && row.winners === row.expectedWinners && row.errors === 0),
    });
  } else {
    checks.push({ target: claimTarget, section: 'contention', measured: contention.length > 0 ? `${claims(contention)} (not ${fmt(TARGETS.claimers)} claimers)` : NOT_MEASURED, met: null });
  }

  const rates = (results.writeRate?.summary ?? []).filter((row) => Number.isFinite(row.progressWritesPerSecond));
  const rateTarget = 'Job-document writes: about 1 a second sustained, at most';
  if (rates.length === 0 && (results.writeRate?.summary.length ?? 0) > 0) {
    // Steps too short for two progress writes (the smoke plan): no sustained rate to compare.
    checks.push({ target: rateTarget, section: 'writeRate', measured: 'no sustained rate: one progress write or none per step at the paces run', met: null });
  } else {
    checks.push(
      check(
        rateTarget,
        'writeRate',
        rates.length > 0 ? Math.max(...rates.map((row) => row.progressWritesPerSecond)) : undefined,
        (value) =>
          `${fmt(value, 2)} writes/s at most (${rates.map((row) => `${fmt(row.progressWritesPerSecond, 2)} with sections at ${fmt(row.sectionsPerSecond, 1)}/s`).join('; ')}); ` +
          `${fmt(TARGETS.sustainedJobWritesPerSecond, 2)} allowed for timer jitter`,
        (value) => value <= TARGETS.sustainedJobWritesPerSecond,
      ),
    );
  }

  const sweeper = results.sweeper?.summary ?? [];
  const [fewer, more] = TARGETS.sweeperJobs;
  const small = sweeper.find((row) => row.totalJobs === fewer);
  const large = sweeper.find((row) => row.totalJobs === more);
  const sweeperTarget = `Sweeper reads flat from ${fmt(fewer)} to ${fmt(more)} jobs`;
  const sweeps = (from: (typeof sweeper)[number], to: (typeof sweeper)[number]): string =>
    `${fmt(from.documentsRead)} → ${fmt(to.documentsRead)} documents read (${fmt(from.billedReads)} → ${fmt(to.billedReads)} billed) per sweep`;
  if (small && large) {
    checks.push({ target: sweeperTarget, section: 'sweeper', measured: sweeps(small, large), met: large.documentsRead <= small.documentsRead && large.billedReads <= small.billedReads });
  } else {
    const sorted = [...sweeper].sort((a, b) => a.totalJobs - b.totalJobs);
    const first = sorted[0];
    const last = sorted.at(-1);
    checks.push({
      target: sweeperTarget,
      section: 'sweeper',
      measured: first && last && first !== last ? `${sweeps(first, last)} at ${fmt(first.totalJobs)} → ${fmt(last.totalJobs)} jobs, not ${fmt(fewer)} → ${fmt(more)}` : NOT_MEASURED,
      met: null,
    });
  }
  return checks;
}
