/**
 * The import graph of functions/src, read from the source (type imports, re-exports and dynamic
 * imports included): it has no cycle, and no import runs up the layer order eslint.config.mjs
 * declares (LAYER_ORDER). The lint rules give the same answer file by file as code is written;
 * this reads every import resolved to its file, at any depth, and names each cycle it finds.
 */
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join, posix, relative, sep } from 'node:path';
import * as ts from 'typescript';

const ROOT = join(__dirname, '..', '..');
const SOURCE = join(ROOT, 'functions', 'src');

/** The one import allowed to run up the layers for now, and why it goes. */
/** Imports allowed up the layers for now, each with when it goes: none (the operator is handed its registry). */
const KNOWN_UPWARD = new Map<string, string>();

/** Every module a file names: imports and re-exports (type-only too), `import()` types and calls, `require` calls. */
function specifiersOf(path: string, text: string): string[] {
  const found: string[] = [];
  const visit = (node: ts.Node): void => {
    if ((ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) && node.moduleSpecifier && ts.isStringLiteral(node.moduleSpecifier)) found.push(node.moduleSpecifier.text);
    else if (ts.isImportEqualsDeclaration(node) && ts.isExternalModuleReference(node.moduleReference) && ts.isStringLiteral(node.moduleReference.expression)) found.push(node.moduleReference.expression.text);
    else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument) && ts.isStringLiteral(node.argument.literal)) found.push(node.argument.literal.text);
    else if (ts.isCallExpression(node) && (node.expression.kind === ts.SyntaxKind.ImportKeyword || (ts.isIdentifier(node.expression) && node.expression.text === 'require'))) {
      const [first] = node.arguments;
      if (first && ts.isStringLiteralLike(first)) found.push(first.text);
    }
    ts.forEachChild(node, visit);
  };
  visit(ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true));
  return found;
}

/** Files (posix paths relative to the source root) to the files they import; a relative import that names no file is an error. */
function importGraph(files: ReadonlyMap<string, string>): Map<string, Set<string>> {
  const graph = new Map<string, Set<string>>();
  for (const [path, text] of files) {
    const targets = new Set<string>();
    for (const specifier of specifiersOf(path, text)) {
      if (!specifier.startsWith('.')) continue;
      const base = posix.normalize(posix.join(posix.dirname(path), specifier));
      const target = [`${base}.ts`, `${base}/index.ts`, base].find((candidate) => files.has(candidate));
      if (target === undefined) throw new Error(`${path} imports ${specifier}, which names no file under functions/src`);
      targets.add(target);
    }
    graph.set(path, targets);
  }
  return graph;
}

/** Each set of files that import one another round (Tarjan's strongly connected components), as one cycle through them. */
function cycles(graph: ReadonlyMap<string, ReadonlySet<string>>): { readonly cycle: string[]; readonly files: string[] }[] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: { cycle: string[]; files: string[] }[] = [];
  const connect = (file: string): void => {
    index.set(file, index.size);
    low.set(file, index.get(file)!);
    stack.push(file);
    onStack.add(file);
    for (const next of graph.get(file) ?? []) {
      if (!index.has(next)) {
        connect(next);
        low.set(file, Math.min(low.get(file)!, low.get(next)!));
      } else if (onStack.has(next)) low.set(file, Math.min(low.get(file)!, index.get(next)!));
    }
    if (low.get(file) !== index.get(file)) return;
    const component = new Set<string>();
    for (let member = stack.pop(); member !== undefined; member = stack.pop()) {
      onStack.delete(member);
      component.add(member);
      if (member === file) break;
    }
    if (component.size > 1 || graph.get(file)?.has(file)) found.push({ cycle: cycleThrough(graph, component, file), files: [...component].sort() });
  };
  for (const file of [...graph.keys()].sort()) if (!index.has(file)) connect(file);
  return found;
}

/** A path from `start` back to itself inside one component (breadth first: the shortest). */
function cycleThrough(graph: ReadonlyMap<string, ReadonlySet<string>>, component: ReadonlySet<string>, start: string): string[] {
  const cameFrom = new Map<string, string>();
  const queue = [start];
  for (let at = queue.shift(); at !== undefined; at = queue.shift()) {
    for (const next of [...(graph.get(at) ?? [])].sort()) {
      if (next === start) {
        const path = [at];
        while (path[0] !== start) path.unshift(cameFrom.get(path[0]!)!);
        return [...path, start];
      }
      if (component.has(next) && !cameFrom.has(next)) {
        cameFrom.set(next, at);
        queue.push(next);
      }
    }
  }
  return [start];
}

/** A file's layer: its top folder, or the deploy entry (a file directly under the source root) above them all. */
function layerOf(path: string, layers: readonly string[]): number {
  const folder = path.includes('/') ? path.slice(0, path.indexOf('/')) : null;
  if (folder === null) return layers.length;
  const position = layers.indexOf(folder);
  if (position < 0) throw new Error(`functions/src/${folder}/ has no place in LAYER_ORDER (eslint.config.mjs): give it one`);
  return position;
}

/** A cycle as the failure names it: one way round, and every file of the set it is in. */
function describeCycle({ cycle, files }: { readonly cycle: readonly string[]; readonly files: readonly string[] }): string {
  return files.length + 1 > cycle.length ? `${cycle.join(' -> ')} (one way round ${files.length} files that import one another: ${files.join(', ')})` : cycle.join(' -> ');
}

function upwardImports(graph: ReadonlyMap<string, ReadonlySet<string>>, layers: readonly string[]): string[] {
  return [...graph].flatMap(([file, targets]) => [...targets].filter((target) => layerOf(target, layers) > layerOf(file, layers)).map((target) => `${file} -> ${target}`));
}

function sourceFiles(directory: string): Map<string, string> {
  const files = new Map<string, string>();
  for (const entry of readdirSync(directory, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile() || !entry.name.endsWith('.ts')) continue;
    const path = join(entry.parentPath, entry.name);
    files.set(relative(directory, path).split(sep).join('/'), readFileSync(path, 'utf8'));
  }
  return files;
}

/** The layer order as eslint.config.mjs exports it (an ES module, which jest's module system cannot load itself). */
function declaredLayers(): string[] {
  const script = "import('./eslint.config.mjs').then((config) => process.stdout.write(JSON.stringify(config.LAYER_ORDER.map(([name]) => name))))";
  const run = spawnSync(process.execPath, ['-e', script], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 });
  if (run.status !== 0) throw new Error(`eslint.config.mjs did not load: ${run.stderr}`);
  return JSON.parse(run.stdout) as string[];
}

describe('the import graph of functions/src', () => {
  const graph = importGraph(sourceFiles(SOURCE));
  let layers: string[];
  beforeAll(() => {
    layers = declaredLayers();
  }, 60_000);

  test('is read whole: every folder, type imports included', () => {
    expect(graph.size).toBeGreaterThan(100);
    // A type-only import and a re-export the graph must hold (store/record-commits.ts imports the handle for types only).
    expect(graph.get('store/record-commits.ts')).toContain('store/firestore-handle.ts');
    expect(graph.get('index.ts')).toContain('api/index.ts');
    expect(graph.get('api/create-phaseline.ts')).toContain('triggers/run-job-step.ts');
  });

  test('has no import cycle', () => {
    expect(cycles(graph).map(describeCycle)).toEqual([]);
  });

  test('has no import that runs up the layer order of eslint.config.mjs', () => {
    const upward = upwardImports(graph, layers);
    expect(upward.filter((edge) => !KNOWN_UPWARD.has(edge))).toEqual([]);
    // An allowance whose import is gone goes too.
    expect([...KNOWN_UPWARD.keys()].filter((edge) => !upward.includes(edge)).map((edge) => `${edge}: ${KNOWN_UPWARD.get(edge)}`)).toEqual([]);
  });

  test('finds a cycle through type imports and re-exports, and names it', () => {
    const probe = new Map([
      ['store/a.ts', "import type { B } from './b';\nexport type A = B;\n"],
      ['store/b.ts', "export type { C as B } from './nested/c';\n"],
      ['store/nested/c.ts', "export type C = typeof import('../a');\n"],
      ['store/d.ts', "import { a } from './a';\nexport const d = a;\n"],
    ]);
    expect(cycles(importGraph(probe)).map(describeCycle)).toEqual(['store/a.ts -> store/b.ts -> store/nested/c.ts -> store/a.ts']);
    expect(cycles(importGraph(new Map([['core/a.ts', "export * from './a';\n"]]))).map(describeCycle)).toEqual(['core/a.ts -> core/a.ts']);
    const twoWaysRound = new Map([
      ['store/a.ts', "import './b';\nimport './c';\n"],
      ['store/b.ts', "import './a';\n"],
      ['store/c.ts', "import './a';\n"],
    ]);
    expect(cycles(importGraph(twoWaysRound)).map(describeCycle)).toEqual(['store/a.ts -> store/b.ts -> store/a.ts (one way round 3 files that import one another: store/a.ts, store/b.ts, store/c.ts)']);
  });

  test('finds an import up the layers at any depth, a dynamic one too, and lets one down pass', () => {
    const probe = new Map([
      ['store/nested/a.ts', "export async function a() { return import('../../engine/b'); }\n"],
      ['engine/b.ts', "import type { C } from '../store/c';\nexport type B = C;\n"],
      ['store/c.ts', "import '../index';\nexport type C = number;\n"],
      ['index.ts', ''],
    ]);
    expect(upwardImports(importGraph(probe), ['store', 'engine'])).toEqual(['store/nested/a.ts -> engine/b.ts', 'store/c.ts -> index.ts']);
    expect(() => layerOf('newfolder/x.ts', ['store'])).toThrow('functions/src/newfolder/ has no place in LAYER_ORDER');
  });

  test('a relative import that names no file fails the reading, so no edge goes unseen', () => {
    expect(() => importGraph(new Map([['core/a.ts', "import { x } from './missing';\n"]]))).toThrow('core/a.ts imports ./missing, which names no file');
  });
});
