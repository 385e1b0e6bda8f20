/**
 * Where the browser tests get their Chromium (test/support/browser.ts). `npm ci && npm test` must
 * be enough on a fresh machine: the Chromium packaged in @sparticuz/chromium comes with `npm ci`,
 * and the system's Chromium is the fallback.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { browserCandidates, executableChromium, launchTestBrowser, PACKAGED_CHROMIUM_CACHE, packagedChromium, SYSTEM_CHROMIUM, type LaunchedBrowser } from '../support/browser';

jest.setTimeout(120_000);

const VIEWPORT = { width: 800, height: 600 };
const profiles: string[] = [];
const launched: LaunchedBrowser[] = [];

function profile(): string {
  const dir = mkdtempSync(join(tmpdir(), 'phaseline-browser-profile-'));
  profiles.push(dir);
  return dir;
}

async function launch(...args: Parameters<typeof launchTestBrowser>): Promise<LaunchedBrowser> {
  const browser = await launchTestBrowser(...args);
  launched.push(browser);
  return browser;
}

afterEach(async () => {
  for (const browser of launched.splice(0)) await browser.context.close();
  for (const dir of profiles.splice(0)) rmSync(dir, { recursive: true, force: true });
  jest.restoreAllMocks();
});

test('bug 13: the packaged Chromium is tried first and the system one second; PHASELINE_CHROMIUM replaces both', () => {
  expect(browserCandidates({}).map((candidate) => candidate.description)).toEqual([packagedChromium.description, `the system's Chromium (${SYSTEM_CHROMIUM})`]);
  expect(browserCandidates({ PHASELINE_CHROMIUM: '/opt/chromium/chrome' }).map((candidate) => candidate.description)).toEqual(['PHASELINE_CHROMIUM (/opt/chromium/chrome)']);
});

test('bug 13: the Chromium that npm ci installed launches headless and runs a page, with no system browser involved', async () => {
  const info = jest.spyOn(console, 'info').mockImplementation(() => undefined);
  const browser = await launch(profile(), { viewport: VIEWPORT }, [packagedChromium]);
  expect(browser.executablePath).not.toBe(SYSTEM_CHROMIUM);
  expect(browser.executablePath.startsWith(`${PACKAGED_CHROMIUM_CACHE}/`)).toBe(true);
  expect(info).toHaveBeenCalledWith(expect.stringContaining(`Browser tests use ${packagedChromium.description}: ${browser.executablePath}`));

  const page = await browser.context.newPage();
  await page.setContent('<main><h1>Phaseline</h1><p id="sum"></p><script>document.getElementById("sum").textContent = String(20 + 22)</script></main>');
  await expect(page.locator('#sum').textContent()).resolves.toBe('42');
  expect((await page.screenshot()).length).toBeGreaterThan(1_000);
});

test('bug 13: a candidate that cannot be used is logged and the next one is launched', async () => {
  const warn = jest.spyOn(console, 'warn').mockImplementation(() => undefined);
  jest.spyOn(console, 'info').mockImplementation(() => undefined);
  const missing = executableChromium('a Chromium that is not installed', '/nonexistent/chromium');
  const browser = await launch(profile(), { viewport: VIEWPORT }, [missing, packagedChromium]);
  expect(browser.description).toBe(packagedChromium.description);
  expect(warn).toHaveBeenCalledWith('Browser tests cannot use a Chromium that is not installed: no file at /nonexistent/chromium');
});

test('bug 13: a Chromium given by its path, as the system one is, launches with the common flags', async () => {
  jest.spyOn(console, 'info').mockImplementation(() => undefined);
  // The packaged binary stands in for /usr/bin/chromium, which a fresh machine does not have.
  const { executablePath } = await packagedChromium.prepare();
  const browser = await launch(profile(), { viewport: VIEWPORT }, [executableChromium('a Chromium at a path', executablePath)]);
  const page = await browser.context.newPage();
  await page.setContent('<p>ok</p>');
  await expect(page.locator('p').textContent()).resolves.toBe('ok');
});

test('bug 13: with no usable Chromium the error says how to get one', async () => {
  jest.spyOn(console, 'warn').mockImplementation(() => undefined);
  await expect(launchTestBrowser(profile(), { viewport: VIEWPORT }, [executableChromium('nothing', '/nonexistent/chromium')])).rejects.toThrow(
    /No Chromium could be launched \(nothing: no file at \/nonexistent\/chromium\)\. `npm ci` installs one on x64 Linux[\s\S]*apt-get install chromium[\s\S]*PHASELINE_CHROMIUM/,
  );
});
