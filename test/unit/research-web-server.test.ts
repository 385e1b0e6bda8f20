/**
 * The local SearXNG-shaped server over the fixture pages (scripts/lib/research-web.ts), which
 * `npm run demo -- --web` and the web research tests run against: the functions' searxng backend
 * reads its answers, its pages read as articles, and it records what was asked of it.
 */
import { readdirSync } from 'node:fs';
import { createSearxngBackend } from '../../functions/src/agent/web/search';
import { readableFromHtml } from '../../functions/src/agent/web/readable';
import { startResearchWeb, WEB_FIXTURES_DIR, type ResearchWeb } from '../../scripts/lib/research-web';

let web: ResearchWeb;
beforeAll(async () => {
  web = await startResearchWeb();
});
beforeEach(() => web.reset());
afterAll(() => web.close());

const signal = () => new AbortController().signal;

test('listens on 127.0.0.1 at a port the OS chose and publishes every fixture page under /pages/', () => {
  expect(web.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
  const files = readdirSync(WEB_FIXTURES_DIR).filter((name) => name.endsWith('.html'));
  expect(files.length).toBeGreaterThanOrEqual(5);
  expect(web.pageUrls).toEqual(files.sort().map((name) => `${web.url}/pages/${name}`));
});

test("the searxng backend reads its JSON: page URLs, titles and descriptions, best first, only pages that match", async () => {
  const backend = createSearxngBackend({ baseUrl: web.url, timeoutMs: 5_000 });
  const hits = await backend.search('fencing token stale worker', 10, signal());
  expect(hits.length).toBeGreaterThan(0);
  expect(hits[0]?.url).toBe(`${web.url}/pages/fencing-tokens.html`);
  expect(hits[0]?.title).toMatch(/^Fencing tokens/);
  expect(hits[0]?.snippet).toMatch(/fencing token/i);
  for (const hit of hits) expect(web.pageUrls).toContain(hit.url);
  expect(hits.map((hit) => hit.score)).toEqual([...hits.map((hit) => hit.score)].sort((a, b) => b - a));
  expect(await backend.search('zebra xylophone', 10, signal())).toEqual([]);
  expect(web.requests.map((request) => request.path)).toEqual([
    `/search?q=fencing+token+stale+worker&format=json`,
    `/search?q=zebra+xylophone&format=json`,
  ]);
});

test('answers only format=json, as an instance configured for it does, and 404 elsewhere', async () => {
  expect((await fetch(`${web.url}/search?q=lease`)).status).toBe(403);
  expect((await fetch(`${web.url}/pages/nothing-here.html`)).status).toBe(404);
  expect((await fetch(`${web.url}/search?q=lease&format=json`, { method: 'POST' })).status).toBe(405);
});

test('each page reads as an article: its own title and prose, without the navigation, banners and footers around it', async () => {
  for (const url of web.pageUrls) {
    const response = await fetch(url);
    expect(response.headers.get('content-type')).toBe('text/html; charset=utf-8');
    const page = readableFromHtml(await response.text());
    expect(page.title.length).toBeGreaterThan(10);
    expect(page.text.split(/\s+/).length).toBeGreaterThan(250);
    expect(page.text).not.toMatch(/©|Subscribe to|cookie|Unsubscribe/);
  }
  expect([...web.pageFetches().values()]).toEqual(web.pageUrls.map(() => 1));
});

test('a revised page is served as revised until reset; requests are counted per page', async () => {
  const [first = '', second = ''] = web.pageUrls;
  web.revisePage(first, '<html><head><title>Revised</title></head><body><p>Changed.</p></body></html>');
  expect(await (await fetch(first)).text()).toContain('Changed.');
  await fetch(first);
  await fetch(second);
  expect(Object.fromEntries(web.pageFetches())).toEqual({ [first]: 2, [second]: 1 });
  expect(() => web.revisePage(`${web.url}/pages/unknown.html`, '')).toThrow(/not one of the pages/);

  web.reset();
  expect(web.requests).toEqual([]);
  expect(await (await fetch(first)).text()).not.toContain('Changed.');
});
