/**
 * `npm run test:mutations`: shows that the protections the promise rests on are tested. Each mutant
 * in scripts/mutations/catalog.ts removes one protection in a scratch copy of the repository; the
 * deterministic tests named with it then run against that copy (one Firestore emulator serves the
 * whole check), and at least one of them must fail. First the same tests must all pass unmutated,
 * or a failure would prove nothing.
 *
 *   npm run test:mutations                      every mutant
 *   npm run test:mutations -- --only a,b        the named ones
 *   npm run test:mutations -- --check           only check that every mutant still applies (no tests)
 *   npm run test:mutations -- --keep            keep the scratch copy afterwards
 *
 * Exits 0 only when every mutant applied and was killed.
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startFirestoreEmulator, type RunningFirestoreEmulator } from './lib/firestore-emulator';
import { REPO_ROOT } from './lib/stack';
import { MUTANTS, type Mutant, type TestSelection } from './mutations/catalog';
import { runJest, selects, type JestRun } from './mutations/jest-run';
import { applyMutant, copyRepository, mutateSource } from './mutations/scratch';

/** A run of one mutant's tests longer than this is stopped and reported as an error. */
const MUTANT_TIMEOUT_MS = 8 * 60_000;

interface Options {
  readonly only: ReadonlySet<string> | null;
  readonly checkOnly: boolean;
  readonly keep: boolean;
}

type Verdict = 'killed' | 'survived' | 'not applied' | 'error';

interface Row {
  readonly mutant: Mutant;
  readonly verdict: Verdict;
  readonly ran: number | null;
  readonly failed: number | null;
  readonly seconds: number | null;
  readonly detail: string | null;
}

function parseOptions(argv: readonly string[]): Options {
  let only: Set<string> | null = null;
  let checkOnly = false;
  let keep = false;
  for (let index = 0; index < argv.length; index += 1) {
    const arg = argv[index];
    if (arg === '--check') checkOnly = true;
    else if (arg === '--keep') keep = true;
    else if (arg === '--only') {
      const names = argv[index + 1];
      if (names === undefined) throw new Error('--only needs a comma-separated list of mutant names');
      only = new Set(names.split(',').filter(Boolean));
      index += 1;
    } else throw new Error(`Unknown argument ${String(arg)}. Usage: tsx scripts/mutations.ts [--only name,name] [--check] [--keep]`);
  }
  if (only) {
    const unknown = [...only].filter((name) => !MUTANTS.some((mutant) => mutant.name === name));
    if (unknown.length > 0) throw new Error(`No such mutant: ${unknown.join(', ')}. Known: ${MUTANTS.map((mutant) => mutant.name).join(', ')}`);
  }
  return { only, checkOnly, keep };
}

/** Null when the mutant applies to the scratch copy, else why not. */
function whyNotApplicable(scratch: string, mutant: Mutant): string | null {
  try {
    mutateSource(mutant, readFileSync(join(scratch, mutant.file), 'utf8'));
    return null;
  } catch (error) {
    return error instanceof Error ? error.message : String(error);
  }
}

const describeSelections = (selections: readonly TestSelection[]): string =>
  selections.map((selection) => `/${selection.names}/ in ${selection.files.join(', ')}`).join('; ');

function verdictOf(run: JestRun): Verdict {
  if (run.error !== null || run.unmatched.length > 0) return 'error';
  return run.failed.length > 0 ? 'killed' : 'survived';
}

function errorOf(run: JestRun): string | null {
  if (run.error !== null) return run.error;
  return run.unmatched.length > 0 ? `names no test: ${describeSelections(run.unmatched)}` : null;
}

/** Why the unmutated run makes this mutant's verdict meaningless, or null when its tests all passed. */
function baselineProblem(baseline: JestRun, mutant: Mutant): string | null {
  if (baseline.error !== null) return `the unmutated run failed: ${baseline.error}`;
  const unmatched = mutant.tests.filter((selection) => baseline.unmatched.includes(selection));
  if (unmatched.length > 0) return `names no test: ${describeSelections(unmatched)}`;
  const failing = baseline.failed.filter((test) => mutant.tests.some((selection) => selects(selection, test)));
  if (failing.length > 0) return `its tests fail without any mutation: ${failing.map((test) => test.name).join('; ')}`;
  return null;
}

function formatSeconds(seconds: number | null): string {
  return seconds === null ? '-' : seconds.toFixed(1);
}

function printTable(rows: readonly Row[]): void {
  const header = ['mutant', 'file', 'tests run', 'failed', 'result', 'seconds'];
  const lines = rows.map((row) => [
    row.mutant.name,
    row.mutant.file,
    row.ran === null ? '-' : String(row.ran),
    row.failed === null ? '-' : String(row.failed),
    row.verdict,
    formatSeconds(row.seconds),
  ]);
  const widths = header.map((title, column) => Math.max(title.length, ...lines.map((line) => (line[column] ?? '').length)));
  const numeric = new Set([2, 3, 5]);
  const render = (cells: readonly string[]) =>
    cells.map((cell, column) => (numeric.has(column) ? cell.padStart(widths[column] ?? 0) : cell.padEnd(widths[column] ?? 0))).join('  ').trimEnd();
  console.log(render(header));
  console.log(render(widths.map((width) => '-'.repeat(width))));
  for (const line of lines) console.log(render(line));
}

async function main(): Promise<number> {
  const options = parseOptions(process.argv.slice(2));
  const started = performance.now();
  const chosen = MUTANTS.filter((mutant) => options.only?.has(mutant.name) ?? true);
  const workdir = mkdtempSync(join(tmpdir(), 'phaseline-mutations-'));
  const scratch = join(workdir, 'repo');
  const logs = join(workdir, 'logs');
  mkdirSync(logs);
  copyRepository(REPO_ROOT, scratch);

  const notApplicable = new Map(chosen.flatMap((mutant) => {
    const why = whyNotApplicable(scratch, mutant);
    return why === null ? [] : [[mutant.name, why] as const];
  }));
  const applicable = chosen.filter((mutant) => !notApplicable.has(mutant.name));
  console.log(`Mutation check: ${chosen.length} mutants, ${applicable.length} apply to the working tree; scratch copy ${scratch}`);
  for (const [name, why] of notApplicable) console.log(`  not applied: ${name}: ${why}`);
  if (options.checkOnly) {
    rmSync(workdir, { recursive: true, force: true });
    return notApplicable.size === 0 ? 0 : 1;
  }

  let emulator: RunningFirestoreEmulator | null = null;
  const stopEmulator = async () => {
    const running = emulator;
    emulator = null;
    await running?.stop();
  };
  const onSignal = (signal: NodeJS.Signals) => {
    void stopEmulator().finally(() => process.exit(signal === 'SIGINT' ? 130 : 143));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const rows: Row[] = [];
  try {
    emulator = await startFirestoreEmulator();
    const env: NodeJS.ProcessEnv = { ...process.env, FIRESTORE_EMULATOR_HOST: emulator.host, METADATA_SERVER_DETECTION: 'none', FORCE_COLOR: '0' };
    console.log(`Firestore emulator at ${emulator.host}; logs in ${logs}`);

    // Every named test must pass unmutated; a mutant whose tests do not cannot be judged.
    let baseline: JestRun | null = null;
    if (applicable.length > 0) {
      baseline = await runJest(scratch, applicable.flatMap((mutant) => mutant.tests), { env, logFile: join(logs, 'baseline.log'), timeoutMs: 2 * MUTANT_TIMEOUT_MS });
      console.log(`Baseline (no mutation): ${baseline.ran} named tests ran, ${baseline.failed.length} failed (${formatSeconds(baseline.seconds)} s).`);
      if (baseline.error !== null) console.log(`  ${baseline.error}`);
      for (const test of baseline.failed) console.log(`  failed without any mutation: ${test.file}: ${test.name}`);
    }

    for (const mutant of chosen) {
      const why = notApplicable.get(mutant.name) ?? null;
      if (why !== null) {
        rows.push({ mutant, verdict: 'not applied', ran: null, failed: null, seconds: null, detail: why });
        continue;
      }
      const problem = baseline === null ? null : baselineProblem(baseline, mutant);
      if (problem !== null) {
        rows.push({ mutant, verdict: 'error', ran: null, failed: null, seconds: null, detail: problem });
        continue;
      }
      const restore = applyMutant(scratch, mutant);
      let run: JestRun;
      try {
        run = await runJest(scratch, mutant.tests, { env, logFile: join(logs, `${mutant.name}.log`), timeoutMs: MUTANT_TIMEOUT_MS });
      } finally {
        restore();
      }
      const verdict = verdictOf(run);
      rows.push({ mutant, verdict, ran: run.ran, failed: run.failed.length, seconds: run.seconds, detail: errorOf(run) });
      console.log(`  ${mutant.name}: ${verdict} (${run.failed.length} of ${run.ran} failed, ${formatSeconds(run.seconds)} s)`);
    }
  } finally {
    await stopEmulator();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    if (!options.keep) rmSync(scratch, { recursive: true, force: true });
  }

  console.log('');
  printTable(rows);
  for (const row of rows) {
    if (row.verdict === 'killed') continue;
    console.log(`\n${row.mutant.name} (${row.verdict}): removes ${row.mutant.removes}`);
    if (row.detail !== null) console.log(`  ${row.detail}`);
    if (row.verdict === 'survived') {
      console.log(`  no test failed among: ${describeSelections(row.mutant.tests)}`);
      console.log(`  log: ${join(logs, `${row.mutant.name}.log`)}`);
    }
  }
  const count = (verdict: Verdict) => rows.filter((row) => row.verdict === verdict).length;
  const totalSeconds = (performance.now() - started) / 1000;
  console.log(
    `\nTotal ${Math.floor(totalSeconds / 60)} min ${Math.round(totalSeconds % 60)} s: ` +
      `${count('killed')} killed, ${count('survived')} survived, ${count('not applied')} not applied, ${count('error')} errors.`,
  );
  const passed = rows.length === chosen.length && rows.every((row) => row.verdict === 'killed');
  // The logs of a failed check are kept for reading; a clean pass leaves nothing behind.
  if (passed && !options.keep) rmSync(workdir, { recursive: true, force: true });
  return passed ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(error instanceof Error ? error.message : error);
    process.exit(1);
  },
);
