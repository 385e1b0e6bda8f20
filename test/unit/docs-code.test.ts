/**
 * Every TypeScript block in README.md and docs/ is a whole module that compiles against the code
 * as it is: `phaseline` is the public API (functions/src/api) and `phaseline/client` the frontend
 * client, resolved as a user's project resolves the installed package. A block that no longer
 * compiles fails here with the page, the line and the compiler's words.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import ts from 'typescript';

const ROOT = join(__dirname, '..', '..');

interface CodeBlock {
  /** The page and the line of the block's opening fence, e.g. `docs/tutorial.md:40`. */
  readonly where: string;
  readonly code: string;
}

/** The ```ts (or ```typescript) blocks of one Markdown page, with the line each starts on. */
function typeScriptBlocks(page: string, markdown: string): CodeBlock[] {
  const blocks: CodeBlock[] = [];
  const lines = markdown.split('\n');
  for (let index = 0; index < lines.length; index++) {
    const fence = /^(`{3,})(ts|typescript)\s*$/.exec(lines[index] ?? '');
    if (!fence) continue;
    const closing = lines.findIndex((line, at) => at > index && line.trimEnd() === fence[1]);
    if (closing === -1) throw new Error(`${page}:${index + 1}: a TypeScript block that never closes`);
    blocks.push({ where: `${page}:${index + 1}`, code: lines.slice(index + 1, closing).join('\n') });
    index = closing;
  }
  return blocks;
}

function markdownPages(): string[] {
  const docs = readdirSync(join(ROOT, 'docs'), { recursive: true, encoding: 'utf8' })
    .filter((name) => name.endsWith('.md'))
    .map((name) => join('docs', name));
  return ['README.md', ...docs.sort()];
}

/** Type-checks the blocks as files of their own beside the repository, and returns each error as `page:line: message`. */
function compileErrors(blocks: readonly CodeBlock[]): string[] {
  const parsed = ts.getParsedCommandLineOfConfigFile(join(ROOT, 'tsconfig.json'), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: (diagnostic) => { throw new Error(ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n')); } });
  if (!parsed) throw new Error('tsconfig.json cannot be read');
  const options: ts.CompilerOptions = {
    ...parsed.options,
    noEmit: true,
    // What a user's project sees once it has installed the package.
    paths: { phaseline: ['functions/src/api/index.ts'], 'phaseline/client': ['client/index.ts'] },
    baseUrl: ROOT,
    // Blocks show their exports to the reader; an unused one is not an error.
    noUnusedLocals: false,
  };
  const virtualRoot = join(ROOT, 'docs-code');
  const files = new Map(blocks.map((block, index) => [join(virtualRoot, `block-${index}.ts`), block] as const));
  const host = ts.createCompilerHost(options);
  const getSourceFile = host.getSourceFile.bind(host);
  host.getSourceFile = (fileName, language, onError, shouldCreate) => {
    const block = files.get(fileName);
    return block ? ts.createSourceFile(fileName, block.code, language) : getSourceFile(fileName, language, onError, shouldCreate);
  };
  const fileExists = host.fileExists.bind(host);
  host.fileExists = (fileName) => files.has(fileName) || fileExists(fileName);
  const readFile = host.readFile.bind(host);
  host.readFile = (fileName) => files.get(fileName)?.code ?? readFile(fileName);
  const program = ts.createProgram([...files.keys()], options, host);
  return [...files].flatMap(([fileName, block]) =>
    ts.getPreEmitDiagnostics(program, program.getSourceFile(fileName)).map((diagnostic) => {
      const line = diagnostic.file && diagnostic.start !== undefined ? diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start).line + 1 : 0;
      const [page = block.where, opening = '0'] = block.where.split(':');
      return `${page}:${Number(opening) + line}: ${ts.flattenDiagnosticMessageText(diagnostic.messageText, ' ')}`;
    }),
  );
}

describe('the TypeScript in README.md and docs/', () => {
  const blocks = markdownPages().flatMap((page) => typeScriptBlocks(page, readFileSync(join(ROOT, page), 'utf8')));

  test('there is code to check: the README starts with a pipeline, and the tutorial has its steps', () => {
    const pages = new Set(blocks.map((block) => block.where.split(':')[0]));
    expect(pages).toContain('README.md');
    expect(pages).toContain(join('docs', 'tutorial.md'));
    expect(blocks.length).toBeGreaterThanOrEqual(6);
  });

  test('every block compiles against the public API', () => {
    expect(compileErrors(blocks)).toEqual([]);
  }, 120_000);

  test('a block that does not compile is reported with its page and line', () => {
    const broken = typeScriptBlocks('page.md', ['intro', '```ts', "import { definePipeline } from 'phaseline';", 'const n: number = definePipeline;', '```'].join('\n'));
    expect(broken).toEqual([{ where: 'page.md:2', code: "import { definePipeline } from 'phaseline';\nconst n: number = definePipeline;" }]);
    const errors = compileErrors(broken);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatch(/^page\.md:4: Type .* is not assignable to type 'number'/);
  }, 120_000);

  test('an unclosed block is refused, not skipped', () => {
    expect(() => typeScriptBlocks('page.md', '```ts\nconst a = 1;\n')).toThrow('page.md:1: a TypeScript block that never closes');
  });
});
