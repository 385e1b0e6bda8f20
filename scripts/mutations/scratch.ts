/** A scratch copy of the repository to mutate, and the exact search/replace that makes a mutant. */
import { cpSync, existsSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { basename, join, relative } from 'node:path';
import type { Mutant } from './catalog';

/** Never copied: dependencies are linked instead, history and build output are not needed. */
const SKIPPED = new Set(['node_modules', '.git', 'test-output', 'coverage']);
const SKIPPED_PATHS = new Set([join('functions', 'lib'), join('web', 'dist')]);
/** Where npm workspaces may keep dependencies; each one that exists is linked into the copy. */
const DEPENDENCY_DIRS = ['node_modules', join('functions', 'node_modules'), join('web', 'node_modules')];

export function copyRepository(repo: string, scratch: string): void {
  rmSync(scratch, { recursive: true, force: true });
  mkdirSync(scratch, { recursive: true });
  cpSync(repo, scratch, {
    recursive: true,
    filter: (source) => {
      const path = relative(repo, source);
      return path === '' || (!SKIPPED.has(basename(source)) && !SKIPPED_PATHS.has(path));
    },
  });
  for (const dir of DEPENDENCY_DIRS) {
    if (existsSync(join(repo, dir))) symlinkSync(join(repo, dir), join(scratch, dir), 'dir');
  }
}

export class MutantNotApplicableError extends Error {
  constructor(mutant: Mutant, found: number) {
    super(
      `Mutant ${mutant.name}: its search text occurs ${found} times in ${mutant.file}, not exactly once. ` +
        'The code it names has changed: update the search text in scripts/mutations/catalog.ts (and check its tests still cover it).',
    );
    this.name = 'MutantNotApplicableError';
  }
}

function occurrences(text: string, search: string): number {
  if (search === '') return 0;
  let count = 0;
  for (let at = text.indexOf(search); at !== -1; at = text.indexOf(search, at + search.length)) count += 1;
  return count;
}

/** The mutated source; throws MutantNotApplicableError unless the search text occurs exactly once. */
export function mutateSource(mutant: Mutant, source: string): string {
  const found = occurrences(source, mutant.search);
  if (found !== 1) throw new MutantNotApplicableError(mutant, found);
  const at = source.indexOf(mutant.search);
  return source.slice(0, at) + mutant.replace + source.slice(at + mutant.search.length);
}

/** Applies a mutant to the scratch copy; the returned function puts the original back. */
export function applyMutant(scratch: string, mutant: Mutant): () => void {
  const path = join(scratch, mutant.file);
  if (!existsSync(path)) throw new Error(`Mutant ${mutant.name}: ${mutant.file} does not exist`);
  const original = readFileSync(path, 'utf8');
  writeFileSync(path, mutateSource(mutant, original));
  return () => writeFileSync(path, original);
}
