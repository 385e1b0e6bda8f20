/**
 * `npm run bench` (the full plan, results under bench/results/) and `npm run bench:smoke` (a tiny
 * plan, results under test-output/bench-smoke/).
 *
 *   tsx bench/run.ts [--smoke] [--out DIR] [--only compare,write-rate,...] [--with-e2e] [--verbose]
 *   tsx bench/run.ts --render bench/results/results.json   (summarize the raw samples again and re-render; measures nothing)
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { FULL_PLAN, resummarize, runBench, SCENARIOS, SMOKE_PLAN, type BenchPlan, type ScenarioName } from './bench';
import { capacitySection, comparisonTable, renderMarkdown, targetsTable } from './report/markdown';
import type { BenchResults } from './report/results';
import { renderSvg } from './report/svg';

// The admin SDK otherwise probes for a GCE metadata server on a machine that has none.
process.env.METADATA_SERVER_DETECTION ??= 'none';
// tsx turns source maps on, and the Firestore SDK captures a stack trace on every request: mapped,
// that is tens of milliseconds per job that a deployed function (plain node, no source maps) does
// not spend. The bench measures the engine, so it runs as deployed code does.
process.setSourceMapsEnabled(false);

const REPO_ROOT = join(__dirname, '..');

function option(name: string): string | undefined {
  const index = process.argv.indexOf(name);
  return index === -1 ? undefined : process.argv[index + 1];
}

function planFromArgs(): { plan: BenchPlan; out: string } {
  const smoke = process.argv.includes('--smoke');
  let plan: BenchPlan = smoke ? SMOKE_PLAN : FULL_PLAN;
  if (smoke && process.argv.includes('--with-e2e')) {
    plan = { ...plan, throughput: { ...(FULL_PLAN.throughput as NonNullable<BenchPlan['throughput']>), warmupJobs: 0, levels: [{ concurrency: 2, jobs: 2 }] } };
  }
  const only = option('--only');
  if (only !== undefined) {
    const names = only.split(',').map((name) => name.trim());
    const unknown = names.filter((name) => !(SCENARIOS as readonly string[]).includes(name));
    if (unknown.length > 0) throw new Error(`Unknown scenario(s) ${unknown.join(', ')}; known: ${SCENARIOS.join(', ')}`);
    plan = { ...plan, only: new Set(names as ScenarioName[]) };
  }
  if (process.argv.includes('--verbose')) plan = { ...plan, verbose: true };
  const out = option('--out') ?? join(REPO_ROOT, smoke ? 'test-output/bench-smoke' : 'bench/results');
  return { plan, out };
}

function writeOutputs(results: BenchResults, out: string): void {
  mkdirSync(out, { recursive: true });
  writeFileSync(join(out, 'results.json'), `${JSON.stringify(results, null, 2)}\n`);
  writeFileSync(join(out, 'results.md'), renderMarkdown(results));
  writeFileSync(join(out, 'results.svg'), renderSvg(results));
}

/** The recovery rows of the comparison table, the capacity and cost model and the targets, on the terminal as well. */
function printHeadlines(results: BenchResults): void {
  if (results.comparison) {
    const [header, rule, ...rows] = comparisonTable(results.comparison.summary).split('\n');
    console.log(['', header, rule, ...rows.filter((row) => row.includes('Recovery wait'))].join('\n'));
  }
  if (results.capacity) console.log(['', '## Capacity and cost model', '', ...capacitySection(results.capacity)].join('\n'));
  const met = results.targets.filter((check) => check.met === true).length;
  const missed = results.targets.filter((check) => check.met === false).length;
  console.log(
    ['', '## Targets', '', targetsTable(results.targets, false), '', `${met} met, ${missed} missed, ${results.targets.length - met - missed} n/a (not measured in this run, or under other conditions than the target's).`].join('\n'),
  );
}

async function main(): Promise<number> {
  const render = option('--render');
  if (render !== undefined) {
    // Summarizes and renders an earlier run's raw samples again, without measuring anything.
    writeOutputs(resummarize(JSON.parse(readFileSync(render, 'utf8')) as BenchResults), dirname(render));
    console.log(`Summarized ${render} again and rendered results.md and results.svg next to it.`);
    return 0;
  }
  const { plan, out } = planFromArgs();
  console.log(`Phaseline bench (${plan.mode}) → ${out}`);
  const results = await runBench(plan);
  writeOutputs(results, out);
  printHeadlines(results);
  console.log(`Wrote results.md, results.json and results.svg to ${out} after ${(results.meta.durationMs / 60_000).toFixed(1)} minutes.`);
  const failed = Object.keys(results.meta.errors);
  if (failed.length > 0) console.error(`Scenarios that failed: ${failed.join(', ')}`);
  return failed.length > 0 ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
