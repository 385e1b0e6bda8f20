/**
 * A tiny run of the benchmark harness (bench/): figures come out and the invariants hold. No
 * timing is asserted; `npm run bench` is where the numbers come from.
 */
import { runBench, SMOKE_PLAN, type BenchPlan } from '../../bench/bench';
import { renderMarkdown } from '../../bench/report/markdown';
import { renderSvg } from '../../bench/report/svg';
import type { BenchResults } from '../../bench/report/results';

jest.setTimeout(180_000);

const plan: BenchPlan = {
  ...SMOKE_PLAN,
  latencyMs: 1,
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

test('the report renders: a Markdown table and an SVG chart', () => {
  const markdown = renderMarkdown(results);
  expect(markdown).toContain('| Per job (median of repeats) | Phaseline | Retry the whole job | Phase checkpoints only |');
  expect(markdown).toContain('## Where Phaseline is not ahead');
  expect(markdown).toContain('## 7. Capacity and cost model');
  const svg = renderSvg(results);
  expect(svg.startsWith('<svg')).toBe(true);
  expect(svg.trim().endsWith('</svg>')).toBe(true);
});
