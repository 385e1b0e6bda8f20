/**
 * A tiny run of the benchmark harness (bench/): figures come out and the invariants hold. No
 * timing is asserted; `npm run bench` is where the numbers come from.
 */
import { runBench, SMOKE_PLAN, type BenchPlan } from '../../bench/bench';
import { renderMarkdown } from '../../bench/report/markdown';
import { renderSvg } from '../../bench/report/svg';
import type { BenchResults } from '../../bench/report/results';
import { SECTION } from '../../bench/report/sections';
import { TARGETS } from '../../bench/report/targets';

jest.setTimeout(180_000);

const plan: BenchPlan = {
  ...SMOKE_PLAN,
  latencyMs: 1,
  // The full plan's 1 s row, shrunk: the code path runs, the 1 s target stays n/a.
  slowOverhead: { latencyMs: 20, inputs: 1, repeats: 1 },
  writeRate: { paces: [{ intervalMs: 50, sections: 4 }], repeats: 1 },
  sweeper: { totals: [40, 120], expired: 3, repeats: 1 },
  contention: { claimers: [3], jobs: [1, 2], repeats: 1 },
  projectPrefix: `demo-bench-test-${process.env.JEST_WORKER_ID ?? '0'}`,
};

let results: BenchResults;

beforeAll(async () => {
  process.env.METADATA_SERVER_DETECTION ??= 'none';
  results = await runBench(plan, () => undefined);
});

test('every scenario ran', () => {
  expect(results.meta.errors).toEqual({});
  expect(results.comparison?.summary.map((row) => row.implementation).sort()).toEqual(['phase-checkpoints', 'phaseline', 'phaseline-lost-task', 'whole-job']);
  expect(results.overhead).not.toBeNull();
  expect(results.slowOverhead?.latencyMs).toBe(20);
  expect(results.slowOverhead?.summary?.ratios).toHaveLength(1);
  expect(results.writeRate?.summary).toHaveLength(1);
  expect(results.sweeper?.summary).toHaveLength(2);
  expect(results.contention?.summary).toHaveLength(2);
});

test('every job completes, partial exactly when faults were injected, and every fault fired', () => {
  const samples = results.comparison?.samples ?? [];
  expect(samples.length).toBeGreaterThanOrEqual(7);
  for (const sample of samples) {
    expect(sample.status).toBe('completed');
    expect(sample.outcome).toBe(sample.faulted ? 'partial' : 'complete');
    expect(sample.modelCalls).toBeGreaterThan(0);
    if (sample.implementation !== 'in-memory') expect(sample.writes).toBeGreaterThan(0);
    const kinds = new Set(sample.faultEvents.map((event) => event.fault));
    expect([...kinds].sort()).toEqual(sample.faulted ? ['crash', 'malformed', 'outage', 'stall'] : []);
  }
});

test('Phaseline publishes one result per job and repeats no recorded tool call, faults or not', () => {
  const phaseline = results.comparison?.summary.find((row) => row.implementation === 'phaseline');
  expect(phaseline).toMatchObject({ publishedFaultFree: 1, publishedFaulted: 1, repeatedToolCalls: 0, repeatedModelCallsFaultFree: 0 });
  expect(phaseline?.zombieOutcomes).toEqual({ 'ownership-lost': 1 });
  for (const row of results.comparison?.summary ?? []) {
    // The lost-task variant runs only with faults.
    if (row.implementation === 'phaseline-lost-task') expect(row.publishedFaulted).toBe(1);
    else expect(row.publishedFaultFree).toBe(1);
  }
});

test("a killed worker's redelivered task takes its work over; the sweeper recovers a frozen worker and a lost task", () => {
  const summary = results.comparison?.summary ?? [];
  expect(summary.find((row) => row.implementation === 'phaseline')?.recoveredBy).toEqual({ 'killed: redelivered task': 1, 'frozen: sweeper': 1 });
  expect(summary.find((row) => row.implementation === 'phaseline-lost-task')?.recoveredBy).toEqual({ 'killed: sweeper': 1, 'frozen: sweeper': 1 });
});

test('the capacity and cost model comes out of the measured operations', () => {
  const capacity = results.capacity;
  expect(capacity?.perJob.faultFree.reads).toBeGreaterThan(0);
  expect(capacity?.perJob.faultFree.writes).toBeGreaterThan(0);
  expect(capacity?.tasksPerJob.faultFree).toBeGreaterThan(0);
  for (const cost of capacity?.costs ?? []) expect(cost.faultFree).toBeGreaterThan(0);
  expect(capacity?.ceilings.length).toBeGreaterThanOrEqual(4);
});

test('the sweeper reads as many documents with three times the jobs; claims have one winner per job', () => {
  const [small, large] = results.sweeper?.summary ?? [];
  expect(small?.reclaimed).toBe(3);
  expect(large?.documentsRead).toBe(small?.documentsRead);
  for (const row of results.contention?.summary ?? []) {
    expect(row.maxWinnersPerJob).toBe(1);
    expect(row.winners).toBe(row.expectedWinners);
    expect(row.errors).toBe(0);
  }
});

test('the job document is written at least for the claim and the hand-off, never more than once per section besides', () => {
  const [rate] = results.writeRate?.summary ?? [];
  expect(rate?.jobWrites).toBeGreaterThanOrEqual(2);
  expect(rate?.jobWrites).toBeLessThanOrEqual((rate?.sections ?? 0) + 2);
});

test('round trips per agent section are counted: every durable write costs at least one', () => {
  const overhead = results.overhead;
  expect(overhead?.commitsPerSection).toBeGreaterThan(0);
  expect(overhead?.writeRoundTripsPerSection).toBeGreaterThanOrEqual(overhead?.commitsPerSection ?? Number.POSITIVE_INFINITY);
  expect(overhead?.roundTripsPerSection).toBeGreaterThanOrEqual(overhead?.writeRoundTripsPerSection ?? Number.POSITIVE_INFINITY);
  expect(overhead?.roundTripsPerDurableWrite).toBeGreaterThanOrEqual(1);
});

test('the targets are worked out from the figures, n/a where this run measured under other conditions', () => {
  const byTarget = new Map(results.targets.map((check) => [check.target, check]));
  const find = (start: string) => [...byTarget.values()].find((check) => check.target.startsWith(start));
  const overhead = results.overhead;
  expect(find('Document reads per agent section')?.met).toBe((overhead?.readsPerSection ?? Number.NaN) <= TARGETS.readsPerSection);
  expect(find('Document writes per agent section')?.met).toBe((overhead?.writesPerSection ?? Number.NaN) <= TARGETS.writesPerSection);
  expect(find('Every durable write one round trip')?.met).toBe((overhead?.roundTripsPerDurableWrite ?? Number.NaN) <= TARGETS.roundTripsPerDurableWrite);
  expect(typeof find('Recovery wait per killed worker')?.met).toBe('boolean');
  // This plan runs at 1 ms and 20 ms per call, 3 claimers, 40 and 120 jobs: not the targets' conditions.
  expect(find('Durability overhead at 10 ms')?.met).toBeNull();
  expect(find('Durability overhead at 1 s')?.met).toBeNull();
  expect(find('One winner per claim')?.met).toBeNull();
  expect(find('Sweeper reads flat')?.met).toBeNull();
  const markdown = renderMarkdown(results);
  expect(markdown).toContain('## Targets');
  for (const check of results.targets) {
    expect(check.measured).not.toBe('');
    expect(markdown).toContain(`\n## ${SECTION[check.section]}\n`);
  }
});

test('the report renders: a Markdown table and an SVG chart', () => {
  const markdown = renderMarkdown(results);
  expect(markdown).toContain('| Per job (median of repeats) | Phaseline | Retry the whole job | Phase checkpoints only |');
  expect(markdown).toContain('## Where Phaseline is not ahead');
  expect(markdown).toContain('## 7. Capacity and cost model');
  const svg = renderSvg(results);
  expect(svg.startsWith('<svg')).toBe(true);
  expect(svg.trim().endsWith('</svg>')).toBe(true);
});
