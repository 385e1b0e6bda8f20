/**
 * The Chromium the browser tests drive through playwright-core, which never downloads a browser.
 *
 * Candidates, first usable wins, and the choice is logged:
 * 1. `PHASELINE_CHROMIUM`, when set: an explicit choice, used alone (no silent fallback).
 * 2. The Chromium shipped inside the npm package `@sparticuz/chromium` (a pinned dev dependency, so
 *    `npm ci` alone brings it): a known version, whatever the machine has. x64 Linux only.
 * 3. The system's Chromium (`/usr/bin/chromium`, Debian's `chromium` package).
 * A candidate that fails to unpack or to launch is logged and the next one is tried.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { chromium, type BrowserContext } from 'playwright-core';
import { z } from 'zod';
import { REPO_ROOT } from '../../scripts/lib/stack';

export const SYSTEM_CHROMIUM = '/usr/bin/chromium';
const PACKAGED_CHROMIUM_DIR = join(REPO_ROOT, 'node_modules', '@sparticuz', 'chromium');
/**
 * Unpacked once per install and version: beside the package (`npm ci` clears it with the package),
 * private to this checkout's owner, never a shared /tmp path.
 */
export const PACKAGED_CHROMIUM_CACHE = join(REPO_ROOT, 'node_modules', '.cache', 'phaseline-chromium');

/** Without the background-networking flags Chromium keeps trying to reach Google on a closed network. */
const COMMON_ARGS = [
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

/**
 * Flags of the package's own list that the tests must not take: it is tuned for serverless
 * scrapers, and these switch off the same-origin policy and mixed-content blocking (a page could
 * then read every cross-origin header, and the CORS test would prove nothing) or force a single
 * process (needed only inside AWS Lambda's sandbox).
 */
const PACKAGED_ARGS_REFUSED = new Set(['--disable-web-security', '--allow-running-insecure-content', '--single-process']);

export interface BrowserCandidate {
  /** Names the candidate in logs and errors. */
  readonly description: string;
  /** Finds or prepares the executable; throws when this candidate cannot be used here. */
  readonly prepare: () => Promise<{ readonly executablePath: string; readonly args: readonly string[] }>;
}

const unpackAnswer = z.object({ executablePath: z.string(), args: z.array(z.string()) });
const unpackedManifest = z.object({ version: z.string(), args: z.array(z.string()) });

/**
 * The package's ESM entry unpacks into the OS temp directory. It runs in a child Node process
 * (jest's module system cannot load ESM) with TMPDIR pointed at a staging directory that is
 * renamed into place once complete: the package's own default, a shared /tmp/chromium that it
 * trusts whenever it exists, breaks when two runs unpack at once or one is interrupted.
 */
const UNPACK_SCRIPT = `
import packaged from '@sparticuz/chromium';
const executablePath = await packaged.executablePath();
process.stdout.write(JSON.stringify({ executablePath, args: packaged.args }));
`;

/** An unpack takes seconds; a staging directory this old belongs to a run that was killed (about 220 MB each). */
const ABANDONED_STAGING_MS = 15 * 60_000;

function removeAbandonedStaging(cacheRoot: string): void {
  for (const name of readdirSync(cacheRoot)) {
    if (!name.includes('.partial-')) continue;
    const path = join(cacheRoot, name);
    const stats = statSync(path, { throwIfNoEntry: false });
    if (stats && Date.now() - stats.mtimeMs > ABANDONED_STAGING_MS) rmSync(path, { recursive: true, force: true });
  }
}

async function unpackPackagedChromium(): Promise<{ executablePath: string; args: readonly string[] }> {
  if (process.platform !== 'linux' || process.arch !== 'x64') throw new Error(`the package ships an x64 Linux build; this is ${process.platform}/${process.arch}`);
  const packageJson = join(PACKAGED_CHROMIUM_DIR, 'package.json');
  if (!existsSync(packageJson)) throw new Error(`${PACKAGED_CHROMIUM_DIR} is missing: run \`npm ci\``);
  const { version } = z.object({ version: z.string() }).parse(JSON.parse(readFileSync(packageJson, 'utf8')));

  const cacheRoot = PACKAGED_CHROMIUM_CACHE;
  const target = join(cacheRoot, version);
  const manifestPath = join(target, 'unpacked.json');
  const unpacked = (): { executablePath: string; args: readonly string[] } => ({
    executablePath: join(target, 'chromium'),
    args: unpackedManifest.parse(JSON.parse(readFileSync(manifestPath, 'utf8'))).args,
  });
  if (existsSync(manifestPath)) return unpacked();

  mkdirSync(cacheRoot, { recursive: true });
  removeAbandonedStaging(cacheRoot);
  const staging = mkdtempSync(join(cacheRoot, `${version}.partial-`));
  try {
    const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '--eval', UNPACK_SCRIPT], {
      cwd: REPO_ROOT,
      env: { ...process.env, TMPDIR: staging },
      timeout: 120_000,
    });
    const answer = unpackAnswer.parse(JSON.parse(stdout));
    if (answer.executablePath !== join(staging, 'chromium')) throw new Error(`unpacked to ${answer.executablePath}, not into ${staging}`);
    // The manifest is written last: its presence in the target means the unpack completed.
    writeFileSync(join(staging, 'unpacked.json'), JSON.stringify({ version, args: answer.args }));
    try {
      renameSync(staging, target);
    } catch (error) {
      // Another run finished first; its copy is as good as this one.
      if (!existsSync(manifestPath)) throw error;
    }
  } finally {
    rmSync(staging, { recursive: true, force: true });
  }
  return unpacked();
}

export const packagedChromium: BrowserCandidate = {
  description: 'the Chromium packaged in @sparticuz/chromium',
  prepare: async () => {
    const { executablePath, args } = await unpackPackagedChromium();
    return { executablePath, args: [...new Set([...args.filter((arg) => !PACKAGED_ARGS_REFUSED.has(arg)), ...COMMON_ARGS])] };
  },
};

export function executableChromium(description: string, executablePath: string): BrowserCandidate {
  return {
    description,
    prepare: () => (existsSync(executablePath) ? Promise.resolve({ executablePath, args: COMMON_ARGS }) : Promise.reject(new Error(`no file at ${executablePath}`))),
  };
}

/** The candidates in the order tried (see the top of this file). */
export function browserCandidates(env: NodeJS.ProcessEnv = process.env): BrowserCandidate[] {
  const explicit = env.PHASELINE_CHROMIUM;
  if (explicit) return [executableChromium(`PHASELINE_CHROMIUM (${explicit})`, explicit)];
  return [packagedChromium, executableChromium(`the system's Chromium (${SYSTEM_CHROMIUM})`, SYSTEM_CHROMIUM)];
}

export interface LaunchedBrowser {
  readonly context: BrowserContext;
  readonly description: string;
  readonly executablePath: string;
}

/** Launches the first candidate that works, headless, with a persistent profile in `userDataDir`. */
export async function launchTestBrowser(
  userDataDir: string,
  options: { readonly viewport: { readonly width: number; readonly height: number } },
  candidates: readonly BrowserCandidate[] = browserCandidates(),
): Promise<LaunchedBrowser> {
  const failures: string[] = [];
  for (const candidate of candidates) {
    try {
      const { executablePath, args } = await candidate.prepare();
      const context = await chromium.launchPersistentContext(userDataDir, { executablePath, headless: true, args: [...args], viewport: { ...options.viewport } });
      console.info(`Browser tests use ${candidate.description}: ${executablePath}${failures.length > 0 ? ` (not usable: ${failures.join('; ')})` : ''}`);
      return { context, description: candidate.description, executablePath };
    } catch (error) {
      const reason = error instanceof Error ? error.message.split('\n')[0] : String(error);
      failures.push(`${candidate.description}: ${reason}`);
      console.warn(`Browser tests cannot use ${candidate.description}: ${reason}`);
    }
  }
  throw new Error(
    `No Chromium could be launched (${failures.join('; ')}). \`npm ci\` installs one on x64 Linux (@sparticuz/chromium); ` +
      'elsewhere install the system package (`apt-get install chromium` on Debian) or set PHASELINE_CHROMIUM to a Chromium executable.',
  );
}
