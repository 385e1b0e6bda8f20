/** Runs chosen tests of the scratch copy with jest and reads what happened from its JSON report. */
import { closeSync, existsSync, openSync, readFileSync, rmSync } from 'node:fs';
import { join, relative } from 'node:path';
import { exitCodeOf, signalGroup, spawnGroup } from '../lib/processes';
import type { TestSelection } from './catalog';

export interface FailedTest {
  /** Relative to the repository root. */
  readonly file: string;
  readonly name: string;
}

export interface JestRun {
  /** Tests that ran (passed or failed); the ones the name pattern left out are not counted. */
  readonly ran: number;
  readonly failed: readonly FailedTest[];
  /** Selections that matched no test that ran: a renamed test would otherwise shrink the check in silence. */
  readonly unmatched: readonly TestSelection[];
  readonly seconds: number;
  /** Why the run as a whole cannot be judged (a test file did not load, a timeout), or null. */
  readonly error: string | null;
}

interface JestReport {
  readonly numFailedTests: number;
  readonly numPassedTests: number;
  readonly numRuntimeErrorTestSuites: number;
  readonly testResults: readonly {
    readonly name: string;
    readonly message: string;
    readonly assertionResults: readonly { readonly fullName: string; readonly status: string }[];
  }[];
}

const PROJECT_OF_DIR: Readonly<Record<string, string>> = { 'test/unit/': 'unit', 'test/emulator/': 'emulator' };

function projectOf(file: string): string {
  const found = Object.entries(PROJECT_OF_DIR).find(([dir]) => file.startsWith(dir));
  if (!found) throw new Error(`${file}: mutation tests must be deterministic unit or emulator tests (test/unit, test/emulator)`);
  return found[1];
}

/** One jest run covers every selection: the union of their files, any of their name patterns. */
export function jestArguments(selections: readonly TestSelection[], jsonFile: string): string[] {
  const files = [...new Set(selections.flatMap((selection) => selection.files))];
  const projects = [...new Set(files.map(projectOf))];
  const names = selections.map((selection) => `(?:${selection.names})`).join('|');
  return [...files, '--selectProjects', ...projects, '--ci', '--json', `--outputFile=${jsonFile}`, `--testNamePattern=${names}`, '--maxWorkers=2'];
}

/** Whether a selection names this test (jest matches --testNamePattern without regard to case). */
export function selects(selection: TestSelection, test: FailedTest): boolean {
  return selection.files.includes(test.file) && new RegExp(selection.names, 'i').test(test.name);
}

function unmatchedSelections(selections: readonly TestSelection[], report: JestReport, scratch: string): TestSelection[] {
  const ran = report.testResults.flatMap((suite) =>
    suite.assertionResults
      .filter((result) => result.status === 'passed' || result.status === 'failed')
      .map((result) => ({ file: relative(scratch, suite.name), name: result.fullName })),
  );
  return selections.filter((selection) => !ran.some((test) => selects(selection, test)));
}

export async function runJest(
  scratch: string,
  selections: readonly TestSelection[],
  options: { readonly env: NodeJS.ProcessEnv; readonly logFile: string; readonly timeoutMs: number },
): Promise<JestRun> {
  const started = performance.now();
  const jsonFile = `${options.logFile}.json`;
  rmSync(jsonFile, { force: true });
  const log = openSync(options.logFile, 'w');
  const child = spawnGroup(process.execPath, [join(scratch, 'node_modules', 'jest', 'bin', 'jest.js'), ...jestArguments(selections, jsonFile)], {
    cwd: scratch,
    env: options.env,
    stdio: ['ignore', log, log],
  });
  const timeout = { fired: false };
  const timer = setTimeout(() => {
    timeout.fired = true;
    signalGroup(child, 'SIGKILL');
  }, options.timeoutMs);
  await exitCodeOf(child);
  clearTimeout(timer);
  signalGroup(child, 'SIGKILL'); // jest workers left behind, if any
  closeSync(log);
  const seconds = (performance.now() - started) / 1000;
  const judged = (error: string | null, ran = 0, failed: readonly FailedTest[] = [], unmatched: readonly TestSelection[] = []): JestRun => ({
    ran,
    failed,
    unmatched,
    seconds,
    error,
  });

  if (timeout.fired) return judged(`timed out after ${Math.round(options.timeoutMs / 1000)} s (log: ${options.logFile})`);
  if (!existsSync(jsonFile)) return judged(`jest wrote no report (log: ${options.logFile})`);
  const report = JSON.parse(readFileSync(jsonFile, 'utf8')) as JestReport;
  const ran = report.numPassedTests + report.numFailedTests;
  if (report.numRuntimeErrorTestSuites > 0) {
    const broken = report.testResults.filter((suite) => suite.assertionResults.length === 0 && suite.message !== '').map((suite) => suite.name);
    return judged(`a test file did not run: ${broken.join(', ') || 'see the log'} (log: ${options.logFile})`, ran);
  }
  const failed = report.testResults.flatMap((suite) =>
    suite.assertionResults.filter((result) => result.status === 'failed').map((result) => ({ file: relative(scratch, suite.name), name: result.fullName })),
  );
  return judged(null, ran, failed, unmatchedSelections(selections, report, scratch));
}
