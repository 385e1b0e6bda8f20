/**
 * Where `PHASELINE_*` variables may be named: in functions/src only by the configuration module;
 * in docs/configuration.md, exactly the module's declarations (names and defaults),
 * plus every variable the local tools read.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { DECLARED_VARIABLES } from '../../functions/src/config/environment';

const ROOT = join(__dirname, '..', '..');
const CONFIG_MODULE = 'functions/src/config/environment.ts';
const VARIABLE_NAME = /PHASELINE_[A-Z0-9][A-Z0-9_]*/g;

function sourceFiles(folder: string): string[] {
  return readdirSync(join(ROOT, folder), { recursive: true, withFileTypes: true })
    .filter((entry) => entry.isFile() && /\.(ts|mjs|js)$/.test(entry.name))
    .map((entry) => relative(ROOT, join(entry.parentPath, entry.name)));
}

/** `file:line NAME` for every variable name in the files. */
function namesIn(files: readonly string[]): { readonly where: string; readonly name: string }[] {
  return files.flatMap((file) =>
    readFileSync(join(ROOT, file), 'utf8')
      .split('\n')
      .flatMap((line, index) => [...line.matchAll(VARIABLE_NAME)].map(([name]) => ({ where: `${file}:${index + 1}`, name }))),
  );
}

interface ReadmeRow {
  readonly name: string;
  readonly defaultText: string;
}

/** docs/configuration.md: the functions' tables, and the local tools' table under its own heading. */
function documentedConfiguration(page: string): { readonly functions: ReadmeRow[]; readonly tools: ReadmeRow[] } {
  if (!page.startsWith('# Configuration\n')) throw new Error('docs/configuration.md does not start with "# Configuration"');
  const [functionsPart = '', toolsPart = ''] = page.split(/^## Local tools\n/m);
  const rows = (text: string): ReadmeRow[] =>
    [...text.matchAll(/^\| *`(PHASELINE_[A-Z0-9_]+)` *\| *([^|]*?) *\|/gm)].map(([, name = '', defaultText = '']) => ({ name, defaultText: defaultText.replaceAll('`', '') }));
  return { functions: rows(functionsPart), tools: rows(toolsPart) };
}

describe('PHASELINE_* variables in functions/src', () => {
  test('only the configuration module names one', () => {
    const files = sourceFiles('functions/src').filter((file) => file !== CONFIG_MODULE);
    expect(files.length).toBeGreaterThan(50);
    expect(namesIn(files).map(({ where, name }) => `${where} ${name}`)).toEqual([]);
  });

  test('the module declares each variable once', () => {
    const names = DECLARED_VARIABLES.map((declared) => declared.name);
    expect(names.length).toBeGreaterThan(20);
    expect(new Set(names).size).toBe(names.length);
    for (const name of names) expect(name).toMatch(/^PHASELINE_[A-Z0-9_]+$/);
  });
});

describe('the configuration page (docs/configuration.md)', () => {
  const readme = documentedConfiguration(readFileSync(join(ROOT, 'docs', 'configuration.md'), 'utf8'));

  test("lists exactly the module's variables, with their defaults", () => {
    const byName = (rows: readonly ReadmeRow[]) => Object.fromEntries(rows.map((row) => [row.name, row.defaultText]));
    expect(readme.functions.length).toBe(new Set(readme.functions.map((row) => row.name)).size);
    expect(byName(readme.functions)).toEqual(byName(DECLARED_VARIABLES));
  });

  test('also lists every variable the local tools read, apart from the functions\' own', () => {
    const declared = new Set(DECLARED_VARIABLES.map((variable) => variable.name));
    const listed = new Set(readme.tools.map((row) => row.name));
    const tools = ['scripts', 'web', 'bench', 'test/support'].flatMap(sourceFiles);
    const missing = namesIn(tools).filter(({ name }) => !declared.has(name) && !listed.has(name));
    expect(missing.map(({ where, name }) => `${where} ${name}`)).toEqual([]);
    expect(readme.tools.filter((row) => declared.has(row.name))).toEqual([]);
  });

  test("the parser tells the functions' tables from the local tools' table", () => {
    const sample = [
      '# Configuration',
      '| Variable | Default | What it does |',
      '|---|---|---|',
      '| `PHASELINE_A` | `https://x/v1` | a |',
      '## Local tools',
      '| `PHASELINE_B` | unset | b |',
    ].join('\n');
    expect(documentedConfiguration(sample)).toEqual({ functions: [{ name: 'PHASELINE_A', defaultText: 'https://x/v1' }], tools: [{ name: 'PHASELINE_B', defaultText: 'unset' }] });
  });
});
