/**
 * fetch_page against local servers, no internet: the address guard on the first hop and on every
 * redirect hop (with the allow-list), the hop, time and size limits, content types, readable text
 * cut to a token budget with the full text kept as an artifact, and pages too complex to read
 * (refused by a scan, or stopped in their worker thread) without holding the event loop.
 */
import { performance } from 'node:perf_hooks';
import { parseHTML } from 'linkedom';
import type { ToolCall } from '../../functions/src/agent/provider';
import type { ToolResult } from '../../functions/src/agent/tools';
import { createMemoryArtifactStore, type MemoryArtifactStore } from '../../functions/src/agent/web/artifacts';
import { sha256Hex } from '../../functions/src/store/artifact-store';
import { createPageFetcher, type PageFetchLimits, type PageFetchOutcome } from '../../functions/src/agent/web/page-fetcher';
import type { SearchBackend } from '../../functions/src/agent/web/search';
import { measureMarkup } from '../../functions/src/agent/web/markup-shape';
import { readableFromHtml } from '../../functions/src/agent/web/readable';
import { createReadableExtractor } from '../../functions/src/agent/web/readable-extractor';
import { createWebToolbox, FETCH_PAGE_TOOL } from '../../functions/src/agent/web/toolbox';
import { ManualClock } from '../../functions/src/core/clock';
import { ManualTimers } from '../support/timers';
import { ARTICLE_HTML, HUGE_PAGE_BYTES, PLAIN_TEXT, startInternalService, startPageSite, startServer, type LocalServer, type PageSite } from '../support/web-servers';

/** Long enough for a loaded machine to answer on loopback, short enough that a stalled page costs little. */
const SHORT_TIMEOUT_MS = 400;
const LIMITS: Omit<PageFetchLimits, 'allowedAddresses'> = { timeoutMs: 5_000, maxBytes: 1024 * 1024, maxRedirects: 3 };
/** The page site's address, on its port: what these tests allow unless they say otherwise. */
const siteOnly = (): PageFetchLimits['allowedAddresses'] => [{ address: '127.0.0.1', port: site.port }];
const FETCHED_AT = Date.UTC(2026, 2, 4, 12, 0, 0);

let site: PageSite;
let internal: LocalServer;

beforeAll(async () => {
  site = await startPageSite();
  internal = await startInternalService('127.0.0.2');
});

afterAll(async () => {
  await site.close();
  await internal.close();
});

function fetchWith(url: string, limits: Partial<PageFetchLimits> = {}, signal = new AbortController().signal): Promise<PageFetchOutcome> {
  return createPageFetcher({ ...LIMITS, allowedAddresses: siteOnly(), ...limits }).fetch(url, signal);
}

function refusalOf(outcome: PageFetchOutcome): { kind: string; message: string } {
  if (outcome.ok) throw new Error(`expected a refusal, got a page from ${outcome.page.url}`);
  return outcome.refusal;
}

const noSearch: SearchBackend = {
  name: 'none',
  search: () => Promise.reject(new Error('search is not used in these tests')),
};

function pageToolbox(options: { limits?: Partial<PageFetchLimits>; tokenBudget?: number; artifacts?: MemoryArtifactStore; artifactBytesPerJob?: number } = {}) {
  const artifacts = options.artifacts ?? createMemoryArtifactStore();
  const toolbox = createWebToolbox({
    search: noSearch,
    pages: createPageFetcher({ ...LIMITS, allowedAddresses: siteOnly(), ...options.limits }),
    artifacts,
    clock: new ManualClock(FETCHED_AT),
    pageTokenBudget: options.tokenBudget ?? 4_000,
    ...(options.artifactBytesPerJob === undefined ? {} : { artifactBytesPerJob: options.artifactBytesPerJob }),
  }).forJob('job-1');
  return { toolbox, artifacts };
}

let callNumber = 0;
function fetchCall(argumentsText: string): ToolCall {
  callNumber += 1;
  return { id: `call_fetch_${callNumber}`, name: FETCH_PAGE_TOOL, arguments: argumentsText };
}

function contentOf(result: ToolResult): Record<string, unknown> {
  return JSON.parse(result.content) as Record<string, unknown>;
}

describe('the address guard', () => {
  test('a loopback page is refused unless its address is on the allow-list', async () => {
    expect(refusalOf(await fetchWith(`${site.url}/article`, { allowedAddresses: [] })).kind).toBe('blocked_address');
    const allowed = await fetchWith(`${site.url}/article`, { allowedAddresses: siteOnly() });
    expect(allowed.ok).toBe(true);
  });

  test('a host name is checked by the address it resolves to', async () => {
    const refusal = refusalOf(await fetchWith(`http://localhost:${site.port}/article`, { allowedAddresses: [] }));
    expect(refusal.kind).toBe('blocked_address');
    expect(refusal.message).toContain('non-public address');
  });

  test.each([
    ['the metadata server', 'http://169.254.169.254/computeMetadata/v1/'],
    ['IPv6 loopback', 'http://[::1]:9/'],
    ['a private range', 'http://10.0.0.1/'],
    ['multicast', 'http://224.0.0.1/'],
    ['an IPv4-mapped IPv6 loopback', 'http://[::ffff:127.0.0.1]:9/'],
    ['the unspecified address', 'http://0.0.0.0:9/'],
  ])('%s is refused before any connection', async (_name, url) => {
    expect(refusalOf(await fetchWith(url)).kind).toBe('blocked_address');
  });

  test('a redirect to another loopback address is refused at that hop; the internal service is never reached', async () => {
    const before = internal.requests.length;
    const refusal = refusalOf(await fetchWith(`${site.url}/redirect?to=${encodeURIComponent(`${internal.url}/secret`)}`));
    expect(refusal.kind).toBe('blocked_address');
    expect(refusal.message).toContain('127.0.0.2');
    expect(internal.requests.length).toBe(before);
  });

  test('the same redirect is followed when that address is on the allow-list too', async () => {
    const outcome = await fetchWith(`${site.url}/redirect?to=${encodeURIComponent(`${internal.url}/secret`)}`, {
      allowedAddresses: [...siteOnly(), { address: '127.0.0.0/8', port: internal.port }],
    });
    if (!outcome.ok) throw new Error(outcome.refusal.message);
    expect(outcome.page.url).toBe(`${internal.url}/secret`);
    expect(outcome.page.redirects).toEqual([`${internal.url}/secret`]);
    expect(outcome.page.body.toString()).toContain('INTERNAL-SECRET');
  });

  test('bug 33: an allowed address is open on its listed port only: a redirect to another local port is refused at that hop, and that server is never reached', async () => {
    const other = await startServer((_request, response) => {
      response.writeHead(200, { 'content-type': 'text/plain' });
      response.end('RESET-CODES');
    });
    try {
      const redirected = refusalOf(await fetchWith(`${site.url}/redirect?to=${encodeURIComponent(`${other.url}/codes`)}`));
      expect(redirected).toEqual({ kind: 'blocked_address', message: expect.stringContaining(`Refused to connect to 127.0.0.1:${other.port}`) as unknown });
      expect(redirected.message).toContain(`not allowed on port ${other.port}`);
      expect(refusalOf(await fetchWith(`${other.url}/codes`)).kind).toBe('blocked_address');
      expect(other.requests).toHaveLength(0);
      // Listed with its own port, the same server is reached, redirect and all.
      const listed = await fetchWith(`${site.url}/redirect?to=${encodeURIComponent(`${other.url}/codes`)}`, {
        allowedAddresses: [...siteOnly(), { address: '127.0.0.1', port: other.port }],
      });
      expect(listed.ok && listed.page.body.toString()).toBe('RESET-CODES');
    } finally {
      await other.close();
    }
  });

  test('other spellings of loopback on a port not listed are refused at their hop too (IPv4-mapped, IPv6, 0.0.0.0, decimal, short, localhost)', async () => {
    // Listens on every address, so any spelling that got through would reach it.
    const other = await startServer((_request, response) => {
      response.writeHead(200, { 'content-type': 'text/plain' });
      response.end('RESET-CODES');
    }, '::');
    try {
      const port = other.port;
      for (const target of [`[::ffff:127.0.0.1]:${port}`, `[::ffff:7f00:1]:${port}`, `[::1]:${port}`, `[::]:${port}`, `0.0.0.0:${port}`, `2130706433:${port}`, `127.1:${port}`, `localhost:${port}`]) {
        const refusal = refusalOf(await fetchWith(`${site.url}/redirect?to=${encodeURIComponent(`http://${target}/codes`)}`));
        expect({ target, kind: refusal.kind }).toEqual({ target, kind: 'blocked_address' });
      }
      expect(other.requests).toHaveLength(0);
    } finally {
      await other.close();
    }
  });

  test('a redirect to the metadata server is refused, even with loopback allowed', async () => {
    const refusal = refusalOf(await fetchWith(`${site.url}/redirect?to=${encodeURIComponent('http://169.254.169.254/latest/meta-data/')}`));
    expect(refusal.kind).toBe('blocked_address');
    expect(refusal.message).toContain('169.254.169.254');
  });

  test('a redirect to a non-web scheme is refused', async () => {
    const refusal = refusalOf(await fetchWith(`${site.url}/redirect?to=${encodeURIComponent('file:///etc/passwd')}`));
    expect(refusal).toEqual({ kind: 'invalid_url', message: 'Only http and https URLs can be fetched, not file.' });
  });

  test('redirects stop at the hop limit', async () => {
    const refusal = refusalOf(await fetchWith(`${site.url}/loop`, { maxRedirects: 3 }));
    expect(refusal.kind).toBe('too_many_redirects');
    expect(site.requests.filter((request) => request.path === '/loop').length).toBeGreaterThanOrEqual(4);
  });
});

describe('limits', () => {
  test('a page that never answers times out', async () => {
    const started = Date.now();
    const refusal = refusalOf(await fetchWith(`${site.url}/slow-headers`, { timeoutMs: SHORT_TIMEOUT_MS }));
    expect(refusal.kind).toBe('timeout');
    expect(refusal.message).toContain(`within ${SHORT_TIMEOUT_MS} ms`);
    expect(Date.now() - started).toBeLessThan(SHORT_TIMEOUT_MS + 3_000);
  });

  test('a body that stalls after its first bytes times out too', async () => {
    expect(refusalOf(await fetchWith(`${site.url}/slow-body`, { timeoutMs: SHORT_TIMEOUT_MS })).kind).toBe('timeout');
  });

  test("the caller's abort is thrown, not reported as a refusal", async () => {
    const controller = new AbortController();
    const fetching = fetchWith(`${site.url}/slow-headers`, {}, controller.signal);
    setTimeout(() => controller.abort(new Error('step deadline')), 50);
    await expect(fetching).rejects.toThrow('step deadline');
  });

  test('a 20 MB page is cut at the byte limit and the rest is never transferred', async () => {
    const maxBytes = 1024 * 1024;
    const sentBefore = site.hugePageBytesSent();
    const outcome = await fetchWith(`${site.url}/huge`, { maxBytes });
    if (!outcome.ok) throw new Error(outcome.refusal.message);
    expect(outcome.page.truncated).toBe(true);
    expect(outcome.page.body.length).toBe(maxBytes);
    // Give the server a moment to notice the closed socket and stop writing.
    await new Promise((resolve) => setTimeout(resolve, 100));
    const sent = site.hugePageBytesSent() - sentBefore;
    // What the server handed to its socket: the part read plus what the loopback buffers held. A
    // fetcher that read the whole body before cutting it would have taken all 20 MB.
    expect(sent).toBeLessThan(HUGE_PAGE_BYTES / 2);
  });

  test('through the toolbox, the cut is said in the result', async () => {
    const { toolbox } = pageToolbox({ limits: { maxBytes: 64 * 1024 }, tokenBudget: 500 });
    const result = await toolbox.execute(fetchCall(JSON.stringify({ url: `${site.url}/huge` })), new AbortController().signal);
    expect(result.ok).toBe(true);
    const content = contentOf(result);
    expect(content.truncated).toEqual({ bytes: true, tokens: true });
    expect(content.notes).toEqual(expect.arrayContaining([expect.stringContaining('only its first 65536 bytes were read')]));
  });
});

describe('content types', () => {
  test('a plain-text answer is read as text', async () => {
    const { toolbox } = pageToolbox();
    const result = await toolbox.execute(fetchCall(JSON.stringify({ url: `${site.url}/plain` })), new AbortController().signal);
    expect(result.ok).toBe(true);
    expect(contentOf(result)).toMatchObject({ url: `${site.url}/plain`, title: 'Release notes', contentType: 'text/plain', text: PLAIN_TEXT.trim() });
  });

  test('a JSON answer is read as text', async () => {
    const { toolbox } = pageToolbox();
    const result = await toolbox.execute(fetchCall(JSON.stringify({ url: `${site.url}/data.json` })), new AbortController().signal);
    expect(result.ok).toBe(true);
    expect(contentOf(result).text).toContain('fixes the lease renewal race');
  });

  test.each([
    ['/report.pdf', 'Content-Type application/pdf'],
    ['/image', 'Content-Type image/png'],
    ['/untyped', 'no Content-Type'],
  ])('%s is refused with a message the model can act on', async (path, what) => {
    const { toolbox, artifacts } = pageToolbox();
    const result = await toolbox.execute(fetchCall(JSON.stringify({ url: `${site.url}${path}` })), new AbortController().signal);
    expect(result.ok).toBe(false);
    expect(result.sources).toBeUndefined();
    const content = contentOf(result);
    expect(content.reason).toBe('unsupported_content');
    expect(content.error).toContain(what);
    expect(content.error).toContain('reads only HTML and text pages');
    expect(artifacts.list()).toEqual([]);
  });

  test('an HTTP error status is reported', async () => {
    expect(refusalOf(await fetchWith(`${site.url}/missing`))).toEqual({ kind: 'http_error', message: `${site.url}/missing answered HTTP 404 Not Found.` });
  });

  test('a gzip-encoded page is decoded', async () => {
    const outcome = await fetchWith(`${site.url}/gzip`);
    if (!outcome.ok) throw new Error(outcome.refusal.message);
    expect(outcome.page.body.toString()).toContain('<title>Leases and fencing tokens');
  });
});

describe('readable text', () => {
  test('the article is extracted from a realistic page, without navigation, scripts, asides or footer', async () => {
    const { toolbox, artifacts } = pageToolbox();
    const url = `${site.url}/redirect?to=%2Farticle`;
    const result = await toolbox.execute(fetchCall(JSON.stringify({ url })), new AbortController().signal);
    expect(result.ok).toBe(true);
    const content = contentOf(result);
    const text = String(content.text);
    expect(content).toMatchObject({ id: `${site.url}/article`, url: `${site.url}/article`, requestedUrl: url, contentType: 'text/html', fetchedAt: '2026-03-04T12:00:00.000Z' });
    expect(content.title).toContain('Leases and fencing tokens');
    expect(text).toContain('A lease gives a worker the right to act on a resource until a deadline.');
    expect(text).toContain('refuses writes that carry a smaller one');
    expect(text).toContain('Make the comparison and the write one atomic step.');
    // Paragraphs stay apart; source line wrapping inside a paragraph does not.
    expect(text).toMatch(/cannot observe: after a long garbage-collection pause/);
    expect(text).toMatch(/took it over\.\n\nThe fix is a fencing token/);
    for (const clutter of ['NAVIGATION-LINK-TEXT', 'TRACKING-SCRIPT-TEXT', 'ADVERTISEMENT-TEXT', 'FOOTER-TEXT', 'font-family']) expect(text).not.toContain(clutter);
    expect(content.truncated).toEqual({ bytes: false, tokens: false });

    const artifact = artifacts.list()[0];
    expect(artifacts.list()).toHaveLength(1);
    expect(Buffer.from(artifact!.bytes).toString('utf8')).toBe(text);
    expect(artifact!.jobId).toBe('job-1');
    expect(content.artifact).toEqual({ ref: `sha256:${artifact!.sha256}`, sha256: sha256Hex(artifact!.bytes), size: artifact!.bytes.byteLength });
    expect(result.sources).toEqual([
      { url: `${site.url}/article`, title: content.title, passage: expect.stringContaining('fencing token') as unknown, fetchedAt: '2026-03-04T12:00:00.000Z', artifact: content.artifact },
    ]);
  });

  test('a page too big for Readability gets the linear walk: the article text, without navigation or footer', () => {
    const links = '<li><a href="/elsewhere">NAVIGATION-LINK-TEXT</a></li>'.repeat(2_000);
    const paragraphs = Array.from({ length: 500 }, (_, index) => `<p>Paragraph ${index} of a long
      report.</p>`).join('');
    const html = `<html><head><title>Long report</title></head><body><nav><ul>${links}</ul></nav><article><h1>Long report</h1>${paragraphs}</article><footer>FOOTER-TEXT</footer></body></html>`;
    const started = Date.now();
    const page = readableFromHtml(html);
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(page.title).toBe('Long report');
    expect(page.text.startsWith('Long report\n\nParagraph 0 of a long report.\n\nParagraph 1 of a long report.')).toBe(true);
    expect(page.text).toContain('Paragraph 499 of a long report.');
    expect(page.text).not.toContain('NAVIGATION-LINK-TEXT');
    expect(page.text).not.toContain('FOOTER-TEXT');
  });

  test('a page title of any length is cut to 300 characters in the source the thread carries', async () => {
    const { toolbox } = pageToolbox();
    const result = await toolbox.execute(fetchCall(JSON.stringify({ url: `${site.url}/long-title` })), new AbortController().signal);
    const [source] = result.sources ?? [];
    expect(source?.title.startsWith('Fencing Fencing')).toBe(true);
    expect(source?.title.length).toBeLessThanOrEqual(300);
  });

  test('text over the token budget is cut for the model; the artifact keeps all of it', async () => {
    const { toolbox, artifacts } = pageToolbox({ tokenBudget: 100 });
    const result = await toolbox.execute(fetchCall(JSON.stringify({ url: `${site.url}/article` })), new AbortController().signal);
    const content = contentOf(result);
    const shown = String(content.text);
    expect(shown.length).toBeLessThanOrEqual(100 * 4 + 2);
    expect(shown.endsWith('…')).toBe(true);
    const full = Buffer.from(artifacts.list()[0]!.bytes).toString('utf8');
    expect(full.length).toBeGreaterThan(shown.length);
    expect(full).toContain('advice does not stop a stale writer');
    expect(shown).not.toContain('advice does not stop a stale writer');
    expect(content.truncated).toEqual({ bytes: false, tokens: true });
    const kept = content.artifact as { ref: string; size: number };
    expect(content.notes).toEqual([expect.stringContaining(`the full text (${kept.size} bytes) is kept as artifact ${kept.ref}`)]);
  });
});

describe('malformed calls get a readable ok:false result', () => {
  test.each([
    ['not JSON', '{url: ', 'Arguments for fetch_page are not valid JSON.'],
    ['no url', '{}', 'Invalid arguments for fetch_page'],
    ['an extra field', JSON.stringify({ url: 'https://example.org', depth: 2 }), 'Invalid arguments for fetch_page'],
    ['a number for url', JSON.stringify({ url: 42 }), 'Invalid arguments for fetch_page'],
    ['not a URL', JSON.stringify({ url: 'see the second hit' }), '"see the second hit" is not a URL.'],
    ['a file URL', JSON.stringify({ url: 'file:///etc/passwd' }), 'Only http and https URLs can be fetched, not file.'],
    ['credentials in the URL', JSON.stringify({ url: 'http://admin:pw@127.0.0.1:9/' }), 'URLs with a user name or password are not fetched.'],
  ])('%s', async (_name, argumentsText, message) => {
    const { toolbox } = pageToolbox();
    const result = await toolbox.execute(fetchCall(argumentsText), new AbortController().signal);
    expect(result.ok).toBe(false);
    expect(String(contentOf(result).error)).toContain(message);
  });

  test('an unknown tool names the tools there are', async () => {
    const { toolbox } = pageToolbox();
    const result = await toolbox.execute({ id: 'call_x', name: 'read', arguments: '{"id":"a"}' }, new AbortController().signal);
    expect(result).toEqual({ ok: false, content: JSON.stringify({ error: 'Unknown tool "read". Available tools: search, fetch_page.' }) });
  });

  test('the tool specs describe both tools with JSON Schema arguments', () => {
    const { toolbox } = pageToolbox({ tokenBudget: 1234 });
    expect(toolbox.specs.map((spec) => spec.name)).toEqual(['search', 'fetch_page']);
    const fetchSpec = toolbox.specs[1]!;
    expect(fetchSpec.description).toContain('about 1234 tokens');
    expect(fetchSpec.parameters).toMatchObject({ type: 'object', required: ['url'], additionalProperties: false });
  });
});

/** Elements nested `depth` deep: the shape that froze a worker (55 KB of it held the event loop 43 s, 2 MB about 10 minutes). */
function nestedPage(depth: number, open = '<div class="c">', close = '</div>'): string {
  return `<!doctype html><html><head><title>Deep</title></head><body>${open.repeat(depth)}Deep text.${close.repeat(depth)}</body></html>`;
}

/** The longest stretch the event loop went without running a 10 ms interval timer, until `stop`. */
function watchEventLoop(): { ticks(count: number): Promise<void>; stop(): number } {
  let last = performance.now();
  let longest = 0;
  let ticked = 0;
  const waiting: { count: number; resolve: () => void }[] = [];
  const note = (): void => {
    const now = performance.now();
    longest = Math.max(longest, now - last);
    last = now;
  };
  const interval = setInterval(() => {
    note();
    ticked += 1;
    for (const waiter of waiting.filter((entry) => ticked >= entry.count)) {
      waiting.splice(waiting.indexOf(waiter), 1);
      waiter.resolve();
    }
  }, 10);
  return {
    ticks: (count) => new Promise<void>((resolve) => waiting.push({ count: ticked + count, resolve })),
    stop: () => {
      clearInterval(interval);
      note();
      return longest;
    },
  };
}

describe('pages too complex to read', () => {
  let deepSite: LocalServer;
  const pages: Record<string, string> = {
    '/nested': nestedPage(1_500),
    '/unclosed-2mb': `<html><body>${'<div>'.repeat(400_000)}</body></html>`,
    '/many-elements': `<html><body>${'<p>x</p>'.repeat(250_000)}</body></html>`,
  };

  beforeAll(async () => {
    deepSite = await startServer((request, response) => {
      const html = pages[request.url ?? ''];
      response.writeHead(html === undefined ? 404 : 200, { 'content-type': 'text/html; charset=utf-8' });
      response.end(html ?? 'not here');
    });
  });
  afterAll(() => deepSite.close());

  test.each([
    ['1,500 nested elements (31 KB)', '/nested', 'nest more than 256 levels deep'],
    ['2 MB of unclosed elements', '/unclosed-2mb', 'nest more than 256 levels deep'],
    ['250,000 elements side by side', '/many-elements', 'more than 150000 elements'],
  ])('bug 28: a page of %s is refused before parsing, as a tool result the model reads, and the event loop stays free', async (_shape, path, why) => {
    const { toolbox, artifacts } = pageToolbox({ limits: { maxBytes: 3_000_000, allowedAddresses: [{ address: '127.0.0.1', port: deepSite.port }] } });
    const watch = watchEventLoop();
    const result = await toolbox.execute(fetchCall(JSON.stringify({ url: `${deepSite.url}${path}` })), new AbortController().signal);
    const longestGapMs = watch.stop();
    expect(result.ok).toBe(false);
    expect(contentOf(result)).toEqual({ error: expect.stringContaining('too complex to read') as unknown, url: `${deepSite.url}${path}`, reason: 'too_complex' });
    expect(String(contentOf(result).error)).toContain(why);
    expect(artifacts.list()).toEqual([]);
    expect(longestGapMs).toBeLessThan(1_000);
  });

  test('bug 28: the parse runs in a worker thread: a slow page that passes the scan leaves the event loop free and is stopped at the time limit', async () => {
    const timers = new ManualTimers();
    const extractor = createReadableExtractor({ timers, timeLimitMs: 5_000, markupLimits: { maxDepth: 100_000, maxElements: 1_000_000 } });
    const watch = watchEventLoop();
    const reading = extractor.extract(nestedPage(1_000), 'html', new AbortController().signal);
    // Readability takes seconds on this page (minutes on a loaded machine): let its worker run a while before the limit.
    await watch.ticks(50);
    expect(timers.pendingDelays).toEqual([5_000]);
    timers.fireAll();
    const outcome = await reading;
    const longestGapMs = watch.stop();
    expect(outcome).toEqual({ ok: false, reason: 'too_complex', message: expect.stringContaining('took longer than 5000 ms and was stopped') as unknown });
    expect(longestGapMs).toBeLessThan(1_000);
    // The stopped worker is gone; the next page gets a new one.
    const next = await extractor.extract(ARTICLE_HTML, 'html', new AbortController().signal);
    expect(next.ok && next.page.text).toContain('fencing token');
  });

  test('bug 28: a page is handed to a worker under the time limit: a worker that has not answered by then is stopped', async () => {
    const timers = new ManualTimers();
    const extractor = createReadableExtractor({ timers, timeLimitMs: 5_000 });
    const reading = extractor.extract(ARTICLE_HTML, 'html', new AbortController().signal);
    // The worker's answer needs a turn of this event loop, so the limit passes first, however quick the page.
    expect(timers.pendingDelays).toEqual([5_000]);
    timers.fireAll();
    expect(await reading).toEqual({ ok: false, reason: 'too_complex', message: expect.stringContaining('took longer than 5000 ms and was stopped') as unknown });
  });

  test("the caller's abort stops the worker and is thrown", async () => {
    const extractor = createReadableExtractor({ timers: new ManualTimers(), markupLimits: { maxDepth: 100_000, maxElements: 1_000_000 } });
    const controller = new AbortController();
    const reading = extractor.extract(nestedPage(1_500), 'html', controller.signal);
    controller.abort(new Error('step deadline'));
    await expect(reading).rejects.toThrow('step deadline');
  });

  test('a page whose extraction fails in the worker is unreadable, and the next page still reads (text pages too)', async () => {
    const extractor = createReadableExtractor({ markupLimits: { maxDepth: 100_000, maxElements: 1_000_000 } });
    const signal = new AbortController().signal;
    // Past the scan's limits the text walk runs out of stack: a failure inside the worker, reported, not thrown.
    const failed = await extractor.extract(`<html><body>${'<div>'.repeat(20_000)}</body></html>`, 'html', signal);
    expect(failed).toEqual({ ok: false, reason: 'unreadable', message: expect.stringContaining('call stack') as unknown });
    expect(await extractor.extract('Plain\n\ntext page', 'text', signal)).toEqual({ ok: true, page: { title: 'Plain', text: 'Plain\n\ntext page', excerpt: 'Plain text page' } });
  });

  /** Element depth and count as linkedom builds the tree. */
  function parsedShape(html: string): { depth: number; elements: number } {
    interface Node {
      readonly nodeType: number;
      readonly childNodes: ArrayLike<Node>;
    }
    const { document } = parseHTML(html) as unknown as { document: Node };
    let depth = 0;
    let elements = 0;
    const pending: [Node, number][] = [[document, 0]];
    for (let entry = pending.pop(); entry !== undefined; entry = pending.pop()) {
      const [node, level] = entry;
      const own = node.nodeType === 1 ? level + 1 : level;
      if (node.nodeType === 1) {
        elements += 1;
        depth = Math.max(depth, own);
      }
      for (const child of Array.from(node.childNodes)) pending.push([child, own]);
    }
    return { depth, elements };
  }

  test.each([
    ['a realistic article', ARTICLE_HTML],
    ['lists whose items are never closed', '<ul><li>a<li>b<ul><li>c<li>d</ul><li>e</ul>'],
    ['paragraphs closed by the blocks after them', '<div><p>one<p>two<div>three</div><p>four</div>'],
    ['a table without end tags', '<table><tr><td>a<td>b<tr><td>c</table>'],
    ['SVG, where /> closes', '<body><svg><path d="x"/><path/><g><circle/></g><title>t</title></svg><p>x</p></body>'],
    ['HTML, where /> does not', '<div/><div/><div/>x'],
    ['void elements', '<div><p>a<br>b<img src=x></p></div>'],
    ['markup inside a script', '<script>if (a<b) document.write("<div><div>")</script><div>x</div>'],
    ['> and < in quoted attributes', '<div title="a > b"><span data-x=\'<div>\'>x</span></div>'],
    ['markup inside a comment', '<!-- <div><div> --><div>x</div>'],
    ['end tags with nothing open', '</div></span><p>x</p>'],
    ['select options', '<select><option>a<option>b<optgroup><option>c</select>'],
    ['definition lists', '<dl><dt>a<dd>b<dt>c<dd>d</dl>'],
    ['300 nested elements', nestedPage(300)],
  ])('the scan counts the depth and elements linkedom builds: %s', (_shape, html) => {
    expect(measureMarkup(html, { maxDepth: 100_000, maxElements: 1_000_000 })).toEqual(parsedShape(html));
  });

  /** 300 levels the parser nests, behind markup that hid them from the scan, or in two halves the scan saw apart. */
  const half = (between: string): string => `${'<div>'.repeat(200)}${between}${'<div>'.repeat(200)}`;
  test.each([
    ['a self-closed <style/>, whose content the parser reads as markup', `<style/>${'<div>'.repeat(300)}`],
    ['a self-closed <textarea/ > (slash, space, >)', `<textarea/ >${'<div>'.repeat(300)}`],
    ['a short comment <!-->', `<!-->${'<div>'.repeat(300)}`],
    ['a script whose false end </scriptx> is followed by end tags the parser reads as script text', half(`<script></scriptx>${'</div>'.repeat(200)}</script>`)],
    ['end tags </div/>, whose name the parser reads as div/', half('</div/>'.repeat(200))],
    ['end tags after a vertical tab, which the parser counts as part of the name', half('</div\v>'.repeat(200))],
    ['end tags inside a CDATA section after a >', half(`<![CDATA[ > ${'</div>'.repeat(200)} ]]>`)],
    ['end tags inside a bogus end tag </1 …>', half('</1 </div>'.repeat(200))],
    ['SVG after a stray </mi>, where /> no longer closes', `<svg></mi>${'<g/>'.repeat(300)}`],
    ['SVG whose /> sits in an unquoted value', `<svg>${'<g a=b/>'.repeat(300)}`],
    ['an HTML integration point in SVG self-closed', `<svg>${'<foreignObject/>'.repeat(300)}`],
  ])('bug 28: the scan is not led to count shallower than the parser builds: %s', (_shape, html) => {
    const parsed = parsedShape(html);
    expect(parsed.depth).toBeGreaterThan(256);
    expect(measureMarkup(html, { maxDepth: 100_000, maxElements: 1_000_000 })).toEqual(parsed);
    expect(measureMarkup(html).over).toBe('depth');
  });

  test("bug 28: stray </p> and </br> end tags are elements the scan counts (the parser makes one for each)", () => {
    const html = `<body>${'</p></br>'.repeat(2_000)}</body>`;
    expect(measureMarkup(html, { maxDepth: 100_000, maxElements: 1_000_000 })).toEqual(parsedShape(html));
    expect(measureMarkup(html, { maxDepth: 256, maxElements: 3_000 }).over).toBe('elements');
  });
});

describe("the job's budget of kept page text", () => {
  let textSite: LocalServer;
  const PAGE_CHARS = 600_000;

  beforeAll(async () => {
    // Every path a different page of 600 KB of text: 50 of them would keep 30 MB.
    textSite = await startServer((request, response) => {
      const name = request.url ?? '/';
      response.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' });
      response.end(`Page ${name}\n\n${`Words of ${name} `.repeat(PAGE_CHARS / (10 + name.length)).slice(0, PAGE_CHARS)}`);
    });
  });
  afterAll(() => textSite.close());

  test('bug 37: page texts are kept only up to the budget; the pages past it are a tool error the model reads, and nothing of them is stored', async () => {
    const { toolbox, artifacts } = pageToolbox({ limits: { allowedAddresses: [{ address: '127.0.0.1', port: textSite.port }] }, artifactBytesPerJob: 2_000_000 });
    const results: ToolResult[] = [];
    for (let page = 1; page <= 10; page += 1) {
      results.push(await toolbox.execute(fetchCall(JSON.stringify({ url: `${textSite.url}/page-${page}` })), new AbortController().signal));
    }
    expect(results.map((entry) => entry.ok)).toEqual([true, true, true, false, false, false, false, false, false, false]);
    const refused = contentOf(results[3]!);
    expect(refused).toMatchObject({ url: `${textSite.url}/page-4`, reason: 'artifact_budget' });
    expect(String(refused.error)).toContain('2000000 bytes');
    const kept = artifacts.list().reduce((sum, artifact) => sum + artifact.size, 0);
    expect(artifacts.list()).toHaveLength(3);
    expect(kept).toBeLessThanOrEqual(2_000_000);
    // A page already kept costs nothing more: it is read again at the budget.
    const again = await toolbox.execute(fetchCall(JSON.stringify({ url: `${textSite.url}/page-2` })), new AbortController().signal);
    expect(again.ok).toBe(true);
  });
});
