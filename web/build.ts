/**
 * Builds the pages into web/dist: esbuild bundles src/main.ts (the chat page) and src/ops.ts (the
 * operator console), each with the CSS it imports, for the browser; index.html and ops.html are
 * copied beside them. The page reads where the emulators are from
 * /config.json at run time, so one build serves `npm start` and the browser test alike.
 *
 *   npm run build:web      (type-checks web/ first, then calls this)
 */
import { build } from 'esbuild';
import { copyFileSync, mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';

export const WEB_ROOT = __dirname;
export const WEB_DIST = join(WEB_ROOT, 'dist');
/** The pages, each with its own bundle: the chat (`/`, app.js) and the operator console (`/ops`, ops.js). */
export const PAGES = ['index.html', 'ops.html'] as const;

export interface WebBuildResult {
  readonly outdir: string;
  /** Output files and their sizes in bytes. */
  readonly files: readonly { readonly path: string; readonly bytes: number }[];
}

export async function buildWeb(options: { readonly minify?: boolean } = {}): Promise<WebBuildResult> {
  rmSync(WEB_DIST, { recursive: true, force: true });
  mkdirSync(WEB_DIST, { recursive: true });
  const result = await build({
    entryPoints: { app: join(WEB_ROOT, 'src', 'main.ts'), ops: join(WEB_ROOT, 'src', 'ops.ts') },
    outdir: WEB_DIST,
    bundle: true,
    format: 'esm',
    platform: 'browser',
    target: ['es2022', 'chrome110', 'firefox110', 'safari16'],
    minify: options.minify ?? true,
    sourcemap: 'linked',
    metafile: true,
    logLevel: 'warning',
    legalComments: 'linked',
  });
  for (const page of PAGES) copyFileSync(join(WEB_ROOT, page), join(WEB_DIST, page));
  const files = Object.entries(result.metafile.outputs).map(([path, output]) => ({ path, bytes: output.bytes }));
  return { outdir: WEB_DIST, files };
}

if (require.main === module) {
  buildWeb().then(
    (result) => {
      for (const file of result.files.filter((entry) => !entry.path.endsWith('.map'))) {
        console.log(`${file.path}  ${(file.bytes / 1024).toFixed(1)} KiB`);
      }
    },
    (error: unknown) => {
      console.error(error instanceof Error ? error.message : error);
      process.exit(1);
    },
  );
}
