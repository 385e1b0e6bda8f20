/**
 * Local HTTP servers that play the web for the web-tools tests, on loopback addresses and ports
 * the OS picks: a SearXNG instance, Tavily's API (checking the request shape and the key), and
 * a site with an article, redirects, a slow page, a 20 MB page, and answers that are not HTML.
 * Every server records the requests it saw; `close()` drops open connections, so a stalled
 * response never holds a test open.
 */
import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gzipSync } from 'node:zlib';

export interface RecordedRequest {
  readonly method: string;
  /** Path and query, as sent. */
  readonly path: string;
  readonly headers: IncomingHttpHeaders;
  readonly body: string;
}

export interface LocalServer {
  /** `http://host:port`, without a trailing slash. */
  readonly url: string;
  readonly host: string;
  readonly port: number;
  readonly requests: RecordedRequest[];
  close(): Promise<void>;
}

type Handler = (request: IncomingMessage & { readonly body: string }, response: ServerResponse) => void;

/** A server on `host` (any loopback address; Linux answers on all of 127.0.0.0/8). */
export async function startServer(handler: Handler, host = '127.0.0.1'): Promise<LocalServer> {
  const requests: RecordedRequest[] = [];
  const server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      requests.push({ method: request.method ?? '', path: request.url ?? '', headers: request.headers, body });
      handler(Object.assign(request, { body }), response);
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://${host}:${port}`,
    host,
    port,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

function sendJson(response: ServerResponse, status: number, body: unknown): void {
  response.writeHead(status, { 'content-type': 'application/json' });
  response.end(JSON.stringify(body));
}

export interface SearxngResult {
  readonly url: string;
  readonly title: string;
  readonly content: string;
  readonly score?: number;
}

/**
 * SearXNG's `GET /search?q=…&format=json`, answering `results` for every query. With
 * `jsonEnabled: false` it answers 403 to the JSON format, as an instance without `json` in
 * `search.formats` does.
 */
export function startSearxng(results: readonly SearxngResult[], options: { readonly jsonEnabled?: boolean } = {}): Promise<LocalServer> {
  return startServer((request, response) => {
    const url = new URL(request.url ?? '/', 'http://searxng.test');
    if (request.method !== 'GET' || url.pathname !== '/search') return sendJson(response, 404, { error: 'not found' });
    if (url.searchParams.get('format') !== 'json' || options.jsonEnabled === false) {
      response.writeHead(403, { 'content-type': 'text/html' });
      response.end('<h1>403 Forbidden</h1>');
      return;
    }
    const query = url.searchParams.get('q') ?? '';
    sendJson(response, 200, {
      query,
      number_of_results: results.length,
      results: results.map((result) => ({ ...result, engine: 'duckduckgo', engines: ['duckduckgo'], category: 'general', publishedDate: null })),
      answers: [],
      suggestions: [],
      unresponsive_engines: [],
    });
  });
}

export interface TavilyResult {
  readonly url: string;
  readonly title: string;
  readonly content: string;
  readonly score: number;
}

/**
 * Tavily's `POST /search`: it answers only a JSON body with a query and only the Bearer `apiKey`
 * (401 with Tavily's error shape otherwise), and returns `results` cut to `max_results`.
 */
export function startTavily(apiKey: string, results: readonly TavilyResult[]): Promise<LocalServer> {
  return startServer((request, response) => {
    if (request.method !== 'POST' || request.url !== '/search') return sendJson(response, 404, { detail: { error: 'Not found' } });
    if (request.headers.authorization !== `Bearer ${apiKey}`) return sendJson(response, 401, { detail: { error: 'Unauthorized: missing or invalid API key.' } });
    let body: { query?: unknown; max_results?: unknown };
    try {
      body = JSON.parse(request.body) as typeof body;
    } catch {
      return sendJson(response, 400, { detail: { error: 'Invalid JSON body' } });
    }
    if (typeof body.query !== 'string' || body.query === '') return sendJson(response, 400, { detail: { error: 'Query is missing' } });
    const limit = typeof body.max_results === 'number' ? body.max_results : 5;
    sendJson(response, 200, {
      query: body.query,
      follow_up_questions: null,
      answer: null,
      images: [],
      results: results.slice(0, limit).map((result) => ({ ...result, raw_content: null })),
      response_time: 0.42,
      request_id: 'req-local-1',
    });
  });
}

/** An article page with the clutter real pages have around it: navigation, scripts, an aside, a footer. */
export const ARTICLE_HTML = `<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Leases and fencing tokens | Systems Notes</title>
  <meta name="description" content="Why a lease alone cannot stop a paused worker from corrupting state, and how a fencing token fixes it.">
  <style>body { font-family: serif; } .ad { color: red; }</style>
  <script>window.analytics = { track: function () { return 'TRACKING-SCRIPT-TEXT'; } };</script>
</head>
<body>
  <header class="site-header">
    <nav><a href="/">Home</a> | <a href="/archive">Archive</a> | <a href="/about">About</a> | <a href="/subscribe">NAVIGATION-LINK-TEXT</a></nav>
  </header>
  <main>
    <article>
      <h1>Leases and fencing tokens</h1>
      <p class="byline">By A. Writer, 3 March 2026</p>
      <p>A lease gives a worker the right to act on a resource until a deadline. It is a promise about time, and time is exactly
      what a paused process cannot observe: after a long garbage-collection pause, the worker resumes and believes it still holds
      the lease, although the lease expired and another worker took it over.</p>
      <p>The fix is a fencing token: a number that grows with every grant of the lease. The storage layer remembers the highest
      token it has seen and refuses writes that carry a smaller one, so the paused worker's late write is rejected instead of
      overwriting newer work.</p>
      <h2>What the storage must do</h2>
      <ul>
        <li>Compare the token of every write with the highest one it accepted.</li>
        <li>Make the comparison and the write one atomic step.</li>
      </ul>
      <p>Without that atomic comparison, the token is only advice, and advice does not stop a stale writer.</p>
      <aside class="ad">ADVERTISEMENT-TEXT: buy more servers today!</aside>
    </article>
  </main>
  <footer>FOOTER-TEXT © 2026 Systems Notes. All rights reserved.</footer>
</body>
</html>`;

export const PLAIN_TEXT = 'Release notes\n\nVersion 2.1 fixes the lease renewal race.\nVersion 2.0 added fencing tokens.\n';

/** The smallest file a PDF reader would open, for the "not HTML, not text" case. */
export const PDF_BYTES = Buffer.from('%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n', 'latin1');

export interface PageSite extends LocalServer {
  /** Bytes the 20 MB page handed to its socket before the client went away (or it finished). */
  readonly hugePageBytesSent: () => number;
}

export const HUGE_PAGE_BYTES = 20 * 1024 * 1024;
const HUGE_CHUNK = Buffer.from(`<p>${'filler text of a page that never seems to end. '.repeat(1300)}</p>\n`);

/** Writes the 20 MB page in chunks, waiting for the socket to drain, and stops when the client goes. */
function streamHugePage(response: ServerResponse, counted: (bytes: number) => void): void {
  response.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'content-length': String(HUGE_PAGE_BYTES) });
  response.write('<html><head><title>Huge</title></head><body>');
  let sent = 0;
  let closed = false;
  response.on('close', () => (closed = true));
  const writeMore = (): void => {
    while (!closed && sent < HUGE_PAGE_BYTES) {
      const chunk = HUGE_CHUNK.subarray(0, Math.min(HUGE_CHUNK.length, HUGE_PAGE_BYTES - sent));
      sent += chunk.length;
      counted(chunk.length);
      if (!response.write(chunk)) {
        response.once('drain', writeMore);
        return;
      }
    }
    if (!closed) response.end();
  };
  writeMore();
}

/**
 * The site fetch_page reads in the tests:
 * - `/article`: ARTICLE_HTML; `/plain`: PLAIN_TEXT; `/data.json`: JSON; `/report.pdf`: PDF_BYTES;
 *   `/image`: a PNG header; `/untyped`: bytes without a Content-Type; `/gzip`: the article gzipped
 * - `/redirect?to=URL`: a 302 to URL; `/loop`: redirects to itself forever
 * - `/slow-headers`: never answers; `/slow-body`: answers headers and a first chunk, then stalls
 * - `/huge`: a 20 MB page, streamed; `/missing`: 404
 */
export async function startPageSite(host = '127.0.0.1'): Promise<PageSite> {
  let hugeBytes = 0;
  const gzippedArticle = gzipSync(Buffer.from(ARTICLE_HTML));
  const server = await startServer((request, response) => {
    const url = new URL(request.url ?? '/', 'http://site.test');
    switch (url.pathname) {
      case '/article':
        response.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
        return void response.end(ARTICLE_HTML);
      case '/long-title':
        // A page that names itself at length: its title must not travel whole in every transcript save.
        response.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
        return void response.end(ARTICLE_HTML.replace(/<title>[^<]*<\/title>/, `<title>${'Fencing '.repeat(50_000)}</title>`));
      case '/gzip':
        response.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'content-encoding': 'gzip' });
        return void response.end(gzippedArticle);
      case '/plain':
        response.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' });
        return void response.end(PLAIN_TEXT);
      case '/data.json':
        return sendJson(response, 200, { releases: [{ version: '2.1', notes: 'fixes the lease renewal race' }] });
      case '/report.pdf':
        response.writeHead(200, { 'content-type': 'application/pdf' });
        return void response.end(PDF_BYTES);
      case '/image':
        response.writeHead(200, { 'content-type': 'image/png' });
        return void response.end(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
      case '/untyped':
        response.writeHead(200);
        return void response.end(Buffer.from([0, 1, 2, 3]));
      case '/redirect':
        response.writeHead(302, { location: url.searchParams.get('to') ?? '/article' });
        return void response.end();
      case '/loop':
        response.writeHead(301, { location: '/loop' });
        return void response.end();
      case '/slow-headers':
        return; // never answers
      case '/slow-body':
        response.writeHead(200, { 'content-type': 'text/html' });
        response.write('<html><body><p>The first part arrives, the rest never does.');
        return;
      case '/huge':
        return streamHugePage(response, (bytes) => (hugeBytes += bytes));
      default:
        response.writeHead(404, { 'content-type': 'text/html' });
        return void response.end('<h1>Not found</h1>');
    }
  }, host);
  return { ...server, hugePageBytesSent: () => hugeBytes };
}

/** A server on another loopback address holding something no fetched page may reach. */
export function startInternalService(host = '127.0.0.2'): Promise<LocalServer> {
  return startServer((_request, response) => {
    response.writeHead(200, { 'content-type': 'text/plain' });
    response.end('INTERNAL-SECRET: the admin password is hunter2');
  }, host);
}
