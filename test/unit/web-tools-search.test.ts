/**
 * Web search against local servers that play SearXNG and Tavily (request shape and key checked),
 * the citations each hit carries, readable failures, and the toolbox that configuration picks.
 */
import type { ToolCall } from '../../functions/src/agent/provider';
import type { ToolResult, Toolbox } from '../../functions/src/agent/tools';
import { createMemoryArtifactStore } from '../../functions/src/agent/web/artifacts';
import { createPageFetcher } from '../../functions/src/agent/web/page-fetcher';
import { createSearxngBackend, createTavilyBackend, type SearchBackend } from '../../functions/src/agent/web/search';
import { createWebToolbox, WEB_SEARCH_TOOL } from '../../functions/src/agent/web/toolbox';
import { ManualClock } from '../../functions/src/core/clock';
import { configuredProvider } from '../../functions/src/pipelines/providers';
import { startPageSite, startSearxng, startServer, startTavily, type LocalServer, type PageSite, type SearxngResult, type TavilyResult } from '../support/web-servers';

const SEARCHED_AT = Date.UTC(2026, 2, 4, 9, 30, 0);
const TAVILY_KEY = 'tvly-test-0123456789abcdef';

const SEARXNG_RESULTS: SearxngResult[] = [
  { url: 'https://example.org/fencing', title: 'Fencing tokens explained', content: 'A fencing token is a number that grows with every lease grant.', score: 3.5 },
  { url: 'https://example.org/fencing', title: 'Fencing tokens explained (duplicate)', content: 'The same page from another engine.', score: 2 },
  { url: 'javascript:alert(1)', title: 'Not a web page', content: 'A hit no tool should offer.', score: 1.9 },
  { url: 'https://example.com/leases', title: '  Leases\nin  practice ', content: '  Leases bound how long\n a worker may act.  ', score: 1.25 },
  { url: 'https://example.net/clocks', title: 'Clocks lie', content: 'Process pauses make local time untrustworthy.', score: 0.5 },
];

const TAVILY_RESULTS: TavilyResult[] = [
  { url: 'https://docs.example.org/outbox', title: 'The outbox pattern', content: 'Write the message in the same transaction as the state change.', score: 0.91 },
  { url: 'https://blog.example.com/idempotency', title: 'Idempotency keys', content: 'A key makes a retried request apply at most once.', score: 0.77 },
  { url: 'https://news.example.net/exactly-once', title: 'Exactly once is a myth', content: 'Delivery is at least once; effects are made idempotent.', score: 0.52 },
];

let searxng: LocalServer;
let tavilyServer: LocalServer;
let site: PageSite;

beforeAll(async () => {
  [searxng, tavilyServer, site] = await Promise.all([startSearxng(SEARXNG_RESULTS), startTavily(TAVILY_KEY, TAVILY_RESULTS), startPageSite()]);
});

afterAll(async () => {
  await Promise.all([searxng.close(), tavilyServer.close(), site.close()]);
});

function toolboxOver(search: SearchBackend): Toolbox {
  return createWebToolbox({
    search,
    pages: createPageFetcher({ timeoutMs: 5_000, maxBytes: 1_000_000, maxRedirects: 3, allowedAddresses: [{ address: '127.0.0.1', port: site.port }] }),
    artifacts: createMemoryArtifactStore(),
    clock: new ManualClock(SEARCHED_AT),
    pageTokenBudget: 2_000,
  });
}

function searchCall(args: Record<string, unknown> | string): ToolCall {
  return { id: 'call_search_1', name: WEB_SEARCH_TOOL, arguments: typeof args === 'string' ? args : JSON.stringify(args) };
}

function contentOf(result: ToolResult): Record<string, unknown> {
  return JSON.parse(result.content) as Record<string, unknown>;
}

const signal = (): AbortSignal => new AbortController().signal;

describe('SearXNG', () => {
  test('GET /search with the query and format=json; hits are web URLs, each once, tidied, best first, cut to the limit', async () => {
    const toolbox = toolboxOver(createSearxngBackend({ baseUrl: searxng.url, timeoutMs: 2_000 }));
    const before = searxng.requests.length;
    const result = await toolbox.execute(searchCall({ query: 'fencing tokens & leases', limit: 2 }), signal());

    const request = searxng.requests[before]!;
    expect(request.method).toBe('GET');
    const url = new URL(request.path, searxng.url);
    expect(url.pathname).toBe('/search');
    expect(Object.fromEntries(url.searchParams)).toEqual({ q: 'fencing tokens & leases', format: 'json' });

    expect(result.ok).toBe(true);
    expect(contentOf(result)).toEqual({
      query: 'fencing tokens & leases',
      backend: 'searxng',
      results: [
        { id: 'https://example.org/fencing', url: 'https://example.org/fencing', title: 'Fencing tokens explained', snippet: 'A fencing token is a number that grows with every lease grant.', score: 3.5 },
        { id: 'https://example.com/leases', url: 'https://example.com/leases', title: 'Leases in practice', snippet: 'Leases bound how long a worker may act.', score: 1.25 },
      ],
    });
    expect(result.sources).toEqual([
      { url: 'https://example.org/fencing', title: 'Fencing tokens explained', passage: 'A fencing token is a number that grows with every lease grant.', fetchedAt: '2026-03-04T09:30:00.000Z' },
      { url: 'https://example.com/leases', title: 'Leases in practice', passage: 'Leases bound how long a worker may act.', fetchedAt: '2026-03-04T09:30:00.000Z' },
    ]);
  });

  test('a base URL with a trailing slash works the same', async () => {
    const backend = createSearxngBackend({ baseUrl: `${searxng.url}/`, timeoutMs: 2_000 });
    await expect(backend.search('x', 10, signal())).resolves.toHaveLength(3);
  });

  test('an instance without the JSON format says how to enable it', async () => {
    const closed = await startSearxng(SEARXNG_RESULTS, { jsonEnabled: false });
    try {
      const result = await toolboxOver(createSearxngBackend({ baseUrl: closed.url, timeoutMs: 2_000 })).execute(searchCall({ query: 'leases' }), signal());
      expect(result.ok).toBe(false);
      expect(contentOf(result)).toEqual({
        error: 'The SearXNG instance refused the JSON format (HTTP 403): its settings.yml must list json under search.formats.',
        query: 'leases',
        backend: 'searxng',
      });
    } finally {
      await closed.close();
    }
  });

  test.each([
    ['a server error', (response: import('node:http').ServerResponse) => response.writeHead(502).end('bad gateway'), 'The SearXNG instance answered HTTP 502.'],
    ['HTML instead of JSON', (response: import('node:http').ServerResponse) => response.writeHead(200, { 'content-type': 'text/html' }).end('<html></html>'), 'sent no JSON'],
    ['JSON without results', (response: import('node:http').ServerResponse) => response.writeHead(200, { 'content-type': 'application/json' }).end('{"answers":[]}'), 'without a results list'],
    ['no answer in time', () => undefined, 'did not answer within 300 ms'],
  ])('%s is a readable ok:false result', async (_name, answer, message) => {
    const broken = await startServer((_request, response) => answer(response));
    try {
      const result = await toolboxOver(createSearxngBackend({ baseUrl: broken.url, timeoutMs: 300 })).execute(searchCall({ query: 'leases' }), signal());
      expect(result.ok).toBe(false);
      expect(String(contentOf(result).error)).toContain(message);
    } finally {
      await broken.close();
    }
  });

  test("the caller's abort is thrown", async () => {
    const silent = await startServer(() => undefined);
    try {
      const controller = new AbortController();
      const searching = toolboxOver(createSearxngBackend({ baseUrl: silent.url, timeoutMs: 5_000 })).execute(searchCall({ query: 'leases' }), controller.signal);
      setTimeout(() => controller.abort(new Error('step deadline')), 50);
      await expect(searching).rejects.toThrow('step deadline');
    } finally {
      await silent.close();
    }
  });
});

describe('Tavily', () => {
  test('POST /search with the query, the result count and the Bearer key, through the official client', async () => {
    const toolbox = toolboxOver(createTavilyBackend({ apiKey: TAVILY_KEY, baseUrl: tavilyServer.url, timeoutMs: 5_000 }));
    const before = tavilyServer.requests.length;
    const result = await toolbox.execute(searchCall({ query: 'outbox pattern', limit: 2 }), signal());

    const request = tavilyServer.requests[before]!;
    expect(request.method).toBe('POST');
    expect(request.path).toBe('/search');
    expect(request.headers.authorization).toBe(`Bearer ${TAVILY_KEY}`);
    expect(request.headers['content-type']).toContain('application/json');
    expect(JSON.parse(request.body)).toMatchObject({ query: 'outbox pattern', max_results: 2, search_depth: 'basic', include_answer: false, include_raw_content: false });

    expect(result.ok).toBe(true);
    expect(contentOf(result)).toEqual({
      query: 'outbox pattern',
      backend: 'tavily',
      results: TAVILY_RESULTS.slice(0, 2).map((hit) => ({ id: hit.url, url: hit.url, title: hit.title, snippet: hit.content, score: hit.score })),
    });
    expect(result.sources).toEqual(TAVILY_RESULTS.slice(0, 2).map((hit) => ({ url: hit.url, title: hit.title, passage: hit.content, fetchedAt: '2026-03-04T09:30:00.000Z' })));
  });

  test('a refused key is a readable ok:false result that never shows the key', async () => {
    const wrongKey = 'tvly-wrong-key-fedcba9876543210';
    const toolbox = toolboxOver(createTavilyBackend({ apiKey: wrongKey, baseUrl: tavilyServer.url, timeoutMs: 5_000 }));
    const result = await toolbox.execute(searchCall({ query: 'outbox pattern' }), signal());
    expect(result.ok).toBe(false);
    expect(contentOf(result)).toEqual({ error: 'Tavily search failed: Unauthorized: missing or invalid API key.', query: 'outbox pattern', backend: 'tavily' });
    expect(result.content).not.toContain(wrongKey);
  });

  test('an unreachable endpoint is a readable ok:false result', async () => {
    const gone = await startServer(() => undefined);
    const url = gone.url;
    await gone.close();
    const result = await toolboxOver(createTavilyBackend({ apiKey: TAVILY_KEY, baseUrl: url, timeoutMs: 2_000 })).execute(searchCall({ query: 'x' }), signal());
    expect(result.ok).toBe(false);
    expect(String(contentOf(result).error)).toMatch(/^Tavily search failed: /);
    expect(result.content).not.toContain(TAVILY_KEY);
  });
});

describe('malformed search calls get a readable ok:false result', () => {
  test.each([
    ['not JSON', 'query=leases', 'Arguments for search are not valid JSON.'],
    ['a blank query', { query: '   ' }, 'Invalid arguments for search'],
    ['a limit past the maximum', { query: 'leases', limit: 50 }, 'Invalid arguments for search'],
    ['a fractional limit', { query: 'leases', limit: 2.5 }, 'Invalid arguments for search'],
  ])('%s', async (_name, args, message) => {
    const backend: SearchBackend = { name: 'never', search: () => Promise.reject(new Error('must not be called')) };
    const result = await toolboxOver(backend).execute(searchCall(args), signal());
    expect(result.ok).toBe(false);
    expect(String(contentOf(result).error)).toContain(message);
  });
});

describe('the toolbox configuration picks', () => {
  const clock = new ManualClock(SEARCHED_AT);
  const artifacts = createMemoryArtifactStore();
  /** The configured toolbox, bound to a job as the research pipeline binds it (fetch_page keeps artifacts under the job). */
  const configuredToolbox = (env: Record<string, string>) => {
    const { toolbox } = configuredProvider(clock, env, { artifacts });
    return toolbox.forJob?.('job-1') ?? toolbox;
  };

  test('the corpus tools by default', () => {
    expect(configuredProvider(clock, {}, { artifacts }).toolbox.specs.map((spec) => spec.name)).toEqual(['search', 'read']);
  });

  test('SearXNG search and fetch_page, with the fetch settings, end to end on local servers', async () => {
    const toolbox = configuredToolbox({
      PHASELINE_SEARCH: 'searxng',
      PHASELINE_SEARXNG_URL: searxng.url,
      PHASELINE_FETCH_ALLOWED_ADDRESSES: `127.0.0.1:${site.port}`,
      PHASELINE_FETCH_TOKEN_BUDGET: '100',
    });
    expect(toolbox.specs.map((spec) => spec.name)).toEqual(['search', 'fetch_page']);
    const hits = await toolbox.execute(searchCall({ query: 'leases' }), signal());
    expect(hits.ok).toBe(true);
    const page = await toolbox.execute({ id: 'call_page_1', name: 'fetch_page', arguments: JSON.stringify({ url: `${site.url}/article` }) }, signal());
    expect(page.ok).toBe(true);
    expect(contentOf(page).truncated).toEqual({ bytes: false, tokens: true });
  });

  test('fetch_page keeps to the address rules configured: nothing non-public by default', async () => {
    const toolbox = configuredToolbox({ PHASELINE_SEARCH: 'searxng', PHASELINE_SEARXNG_URL: searxng.url });
    const page = await toolbox.execute({ id: 'call_page_2', name: 'fetch_page', arguments: JSON.stringify({ url: `${site.url}/article` }) }, signal());
    expect(page.ok).toBe(false);
    expect(contentOf(page).reason).toBe('blocked_address');
  });

  test("fetch_page keeps page text within the job's configured artifact budget", async () => {
    const kept = createMemoryArtifactStore();
    const { toolbox: configured } = configuredProvider(
      clock,
      { PHASELINE_SEARCH: 'searxng', PHASELINE_SEARXNG_URL: searxng.url, PHASELINE_FETCH_ALLOWED_ADDRESSES: `127.0.0.1:${site.port}`, PHASELINE_FETCH_MAX_BYTES_PER_JOB: '1000' },
      { artifacts: kept },
    );
    // The job holds 500 bytes already; the article's 824 bytes of text would pass the 1000.
    await kept.put('job-budget', 'x'.repeat(500), { contentType: 'text/plain' });
    const bound = configured.forJob?.('job-budget') ?? configured;
    const page = await bound.execute({ id: 'call_page_3', name: 'fetch_page', arguments: JSON.stringify({ url: `${site.url}/article` }) }, signal());
    expect(contentOf(page)).toMatchObject({ reason: 'artifact_budget' });
    expect(kept.list()).toHaveLength(1);
  });

  test('Tavily with its key and base URL', async () => {
    const toolbox = configuredToolbox({ PHASELINE_SEARCH: 'tavily', PHASELINE_TAVILY_API_KEY: TAVILY_KEY, PHASELINE_TAVILY_BASE_URL: `${tavilyServer.url}/` });
    const hits = await toolbox.execute(searchCall({ query: 'outbox' }), signal());
    expect(contentOf(hits)).toMatchObject({ backend: 'tavily', results: expect.any(Array) as unknown });
    expect(hits.sources).toHaveLength(3);
  });
});
