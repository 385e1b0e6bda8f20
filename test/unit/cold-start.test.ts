/**
 * What a function instance loads at cold start: the deployed entry point (functions/src/index.ts,
 * loaded in a fresh node process as the runtime loads it) must not pull in the packages only some
 * tools and models need. The page parser runs in the extraction worker thread, the search client
 * and the AI SDK load at their first use; loaded at cold start they cost every new instance, on the
 * recovery path of a lost worker too, over a third of the functions' load time (bench/cold-start.ts
 * measures it).
 */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';

const ROOT = join(__dirname, '..', '..');
const ON_DEMAND = ['linkedom', '@mozilla/readability', '@tavily/core', 'ai'];

/** The packages among `names` that a fresh process has loaded after requiring `entry` (a path under the repository). */
function loadedAfterRequiring(entry: string, names: readonly string[]): string[] {
  const script = [
    `require(${JSON.stringify(join(ROOT, entry))});`,
    `const files = Object.keys(require.cache);`,
    `process.stdout.write(JSON.stringify(${JSON.stringify(names)}.filter((name) => files.some((file) => file.includes('/node_modules/' + name + '/')))));`,
  ].join('\n');
  const run = spawnSync(process.execPath, ['--import', 'tsx', '-e', script], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 });
  if (run.status !== 0) throw new Error(`${entry} did not load: ${run.stderr}`);
  return JSON.parse(run.stdout) as string[];
}

describe('cold start of the deployed functions', () => {
  test('loads no page parser, no search client and no AI SDK', () => {
    expect(loadedAfterRequiring('functions/src/index.ts', ON_DEMAND)).toEqual([]);
  });

  test('the check sees a package a module loads (the page reader the extraction worker runs)', () => {
    expect(loadedAfterRequiring('functions/src/agent/web/readable.ts', ON_DEMAND)).toEqual(['linkedom', '@mozilla/readability']);
  });
});
