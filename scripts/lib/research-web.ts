/**
 * A local stand-in for the web a research job reads: a SearXNG-shaped search API
 * (`GET /search?q=…&format=json`, the fields the functions' searxng backend reads, and the others a
 * real instance sends) over the articles in scripts/web-fixtures/, and those articles themselves
 * under `/pages/`, on 127.0.0.1 at a port the OS picks. `npm run demo -- --web` and the tests point
 * PHASELINE_SEARXNG_URL at it and let fetch_page reach 127.0.0.1.
 *
 * Every request is recorded, so a test can tell which pages fetch_page asked for and how often;
 * a page can be revised while the server runs, so a test can show that a recorded result is not
 * fetched again.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { contentTerms } from '../../functions/src/providers/offline/text';

/** The articles the server publishes: plain HTML files, written for this project. */
export const WEB_FIXTURES_DIR = join(__dirname, '..', 'web-fixtures');
export const PAGES_PREFIX = '/pages/';
/** SearXNG answers one page of results; about this many. */
const RESULTS_PER_PAGE = 10;

export interface RecordedWebRequest {
  readonly method: string;
  /** Path and query, as sent. */
  readonly path: string;
}

export interface ResearchWeb {
  /** `http://127.0.0.1:<port>`, without a trailing slash: the SearXNG base URL. */
  readonly url: string;
  /** Every page's URL, in file-name order. */
  readonly pageUrls: readonly string[];
  /** Every request, in arrival order. */
  readonly requests: readonly RecordedWebRequest[];
  /** How many GET requests each page URL received (pages never requested are absent). */
  pageFetches(): ReadonlyMap<string, number>;
  /** Serves `html` at the page's URL from now on (its search entry follows). */
  revisePage(pageUrl: string, html: string): void;
  /** Serves every page as published again and forgets the recorded requests. */
  reset(): void;
  close(): Promise<void>;
}

export interface ResearchWebOptions {
  /** A folder of `.html` files; the bundled fixtures by default. */
  readonly directory?: string;
  /** A loopback address; 127.0.0.1 by default. */
  readonly host?: string;
}

interface IndexedPage {
  readonly html: string;
  readonly title: string;
  readonly description: string;
  readonly titleTerms: ReadonlySet<string>;
  readonly descriptionTerms: ReadonlySet<string>;
  readonly bodyCounts: ReadonlyMap<string, number>;
}

const ENTITIES: Readonly<Record<string, string>> = { amp: '&', lt: '<', gt: '>', quot: '"', apos: "'", nbsp: ' ' };

function plainText(html: string): string {
  return html
    .replace(/<(script|style)\b[\s\S]*?<\/\1>/gi, ' ')
    .replace(/<[^>]+>/g, ' ')
    .replace(/&(#\d+|[a-z]+);/gi, (entity, name: string) => (name.startsWith('#') ? String.fromCodePoint(Number(name.slice(1))) : (ENTITIES[name.toLowerCase()] ?? entity)))
    .replace(/\s+/g, ' ')
    .trim();
}

/** What the search reads of a page: its title, its description, and the words of its article. */
function indexPage(html: string): IndexedPage {
  const title = plainText(/<title[^>]*>([\s\S]*?)<\/title>/i.exec(html)?.[1] ?? '');
  const description = plainText(/<meta\s+name="description"\s+content="([^"]*)"/i.exec(html)?.[1] ?? '');
  const article = /<article\b[\s\S]*?<\/article>/i.exec(html)?.[0] ?? html;
  const bodyCounts = new Map<string, number>();
  for (const term of contentTerms(plainText(article))) bodyCounts.set(term, (bodyCounts.get(term) ?? 0) + 1);
  return { html, title, description, titleTerms: new Set(contentTerms(title)), descriptionTerms: new Set(contentTerms(description)), bodyCounts };
}

/** A relevance score: title words count most, then the description, then (dampened) the article's words. */
function scoreOf(page: IndexedPage, queryTerms: readonly string[]): number {
  let score = 0;
  for (const term of queryTerms) {
    if (page.titleTerms.has(term)) score += 3;
    if (page.descriptionTerms.has(term)) score += 2;
    const count = page.bodyCounts.get(term) ?? 0;
    if (count > 0) score += 1 + Math.log(count);
  }
  return Math.round(score * 1000) / 1000;
}

function sendJson(response: ServerResponse, status: number, body: unknown): void {
  response.writeHead(status, { 'content-type': 'application/json; charset=utf-8' });
  response.end(JSON.stringify(body));
}

function sendText(response: ServerResponse, status: number, type: string, body: string, head: boolean): void {
  response.writeHead(status, { 'content-type': `${type}; charset=utf-8` });
  response.end(head ? undefined : body);
}

function escapeHtml(text: string): string {
  return text.replace(/[&<>"]/g, (character) => `&#${character.charCodeAt(0)};`);
}

/** Starts the server; `close()` stops it, dropping open connections. */
export async function startResearchWeb(options: ResearchWebOptions = {}): Promise<ResearchWeb> {
  const directory = options.directory ?? WEB_FIXTURES_DIR;
  const host = options.host ?? '127.0.0.1';
  const files = readdirSync(directory)
    .filter((name) => name.endsWith('.html'))
    .sort();
  if (files.length === 0) throw new Error(`${directory} holds no .html pages to serve`);
  // Keyed by path (`/pages/<file>`); the URLs need the port, known only once listening.
  const published = (): [string, IndexedPage][] => files.map((name) => [`${PAGES_PREFIX}${name}`, indexPage(readFileSync(join(directory, name), 'utf8'))]);
  const pages = new Map<string, IndexedPage>(published());
  const requests: RecordedWebRequest[] = [];
  let base = '';

  const search = (query: string): unknown[] => {
    const queryTerms = [...new Set(contentTerms(query))];
    return [...pages.entries()]
      .map(([path, page]) => ({ path, page, score: scoreOf(page, queryTerms) }))
      .filter((hit) => hit.score > 0)
      .sort((left, right) => right.score - left.score || (left.path < right.path ? -1 : 1))
      .slice(0, RESULTS_PER_PAGE)
      .map(({ path, page, score }, rank) => {
        const url = `${base}${path}`;
        const parsed = new URL(url);
        return {
          url,
          title: page.title,
          content: page.description,
          engine: 'phaseline-fixtures',
          engines: ['phaseline-fixtures'],
          positions: [rank + 1],
          score,
          category: 'general',
          template: 'default.html',
          parsed_url: [parsed.protocol.replace(/:$/, ''), parsed.host, parsed.pathname, '', '', ''],
          publishedDate: null,
        };
      });
  };

  const handle = (request: IncomingMessage, response: ServerResponse): void => {
    const method = request.method ?? '';
    requests.push({ method, path: request.url ?? '' });
    if (method !== 'GET' && method !== 'HEAD') {
      response.setHeader('allow', 'GET, HEAD');
      return sendText(response, 405, 'text/plain', 'Method not allowed\n', false);
    }
    const head = method === 'HEAD';
    const url = new URL(request.url ?? '/', base);
    if (url.pathname === '/search') {
      // Like an instance whose settings.yml lists only json under search.formats.
      if (url.searchParams.get('format') !== 'json') return sendText(response, 403, 'text/html', '<h1>403 Forbidden</h1><p>Only format=json is served here.</p>', head);
      const query = url.searchParams.get('q') ?? '';
      const results = search(query);
      return sendJson(response, 200, {
        query,
        number_of_results: results.length,
        results,
        answers: [],
        corrections: [],
        infoboxes: [],
        suggestions: [],
        unresponsive_engines: [],
      });
    }
    const page = pages.get(url.pathname);
    if (page !== undefined) return sendText(response, 200, 'text/html', page.html, head);
    if (url.pathname === '/') {
      const links = [...pages.entries()].map(([path, item]) => `<li><a href="${escapeHtml(path)}">${escapeHtml(item.title)}</a></li>`).join('\n');
      return sendText(response, 200, 'text/html', `<!doctype html><title>Research web (local)</title><h1>Pages</h1><ul>\n${links}\n</ul>`, head);
    }
    return sendText(response, 404, 'text/html', '<h1>Not found</h1>', head);
  };

  const server = createServer((request, response) => {
    try {
      handle(request, response);
    } catch {
      if (!response.headersSent) response.writeHead(400, { 'content-type': 'text/plain; charset=utf-8' });
      response.end('Bad request\n');
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => resolve());
  });
  base = `http://${host}:${(server.address() as AddressInfo).port}`;

  const pathOf = (pageUrl: string): string => {
    const path = pageUrl.startsWith(base) ? pageUrl.slice(base.length) : pageUrl;
    if (!pages.has(path)) throw new Error(`${pageUrl} is not one of the pages this server publishes`);
    return path;
  };
  return {
    url: base,
    pageUrls: [...pages.keys()].map((path) => `${base}${path}`),
    requests,
    pageFetches: () => {
      const counts = new Map<string, number>();
      for (const { method, path } of requests) {
        const pathname = new URL(path, base).pathname;
        if (method === 'GET' && pages.has(pathname)) counts.set(`${base}${pathname}`, (counts.get(`${base}${pathname}`) ?? 0) + 1);
      }
      return counts;
    },
    revisePage: (pageUrl, html) => {
      pages.set(pathOf(pageUrl), indexPage(html));
    },
    reset: () => {
      for (const [path, page] of published()) pages.set(path, page);
      requests.length = 0;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
