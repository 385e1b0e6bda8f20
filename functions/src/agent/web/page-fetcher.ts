/**
 * GET of a URL a model chose, guarded against server-side request forgery. Every connection goes
 * through request-filtering-agent, which checks the address each host name resolves to (or the
 * literal address) and refuses loopback, private, link-local (169.254.169.254, the metadata
 * server), multicast and other non-public ranges, unless an address is on the configured
 * allow-list. That library matches addresses only, so an allowed address would be open on every
 * port (with 127.0.0.1 allowed, a page could redirect the agent to any local service): each
 * allow-list entry names its port, and a connection gets an agent whose list holds only the
 * entries for the port it connects to. Redirects are followed here, one request per hop, so each
 * hop's address and port are checked again; an automatic redirect inside an HTTP client would
 * skip that.
 *
 * Limits: one deadline for the whole fetch (every hop and the body), a hop count, and a byte cap
 * on the decoded body, read as a stream and abandoned at the cap, so a huge page never sits in
 * memory whole. Only HTML and text are read; anything else is refused before its body is read.
 *
 * Nothing here throws for a bad URL, a refused address or a failing server: the outcome names
 * what happened, for the model to read. Only the caller's own abort is thrown.
 */
import { request as httpRequest, type IncomingMessage, type OutgoingHttpHeaders } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { pipeline, type Readable } from 'node:stream';
import { createBrotliDecompress, createGunzip, createInflate } from 'node:zlib';
import { RequestFilteringHttpAgent, RequestFilteringHttpsAgent } from 'request-filtering-agent';

/** fetch_page's limits: time, bytes, redirects, and which addresses it may reach. */
export interface PageFetchLimits {
  /** One deadline for the whole fetch: every redirect hop and the body. */
  readonly timeoutMs: number;
  /** The decoded body is read up to this many bytes; the rest is never read. */
  readonly maxBytes: number;
  readonly maxRedirects: number;
  /** Non-public addresses reachable anyway, each on its one port (local tests: 127.0.0.1 on a test server's port). */
  readonly allowedAddresses: readonly AllowedAddress[];
}

/** An IP address or CIDR range that is not public, reachable on `port` only. */
export interface AllowedAddress {
  readonly address: string;
  readonly port: number;
}

export type PageKind = 'html' | 'text';

export interface FetchedPage {
  readonly requestedUrl: string;
  /** Where the body came from, after redirects. */
  readonly url: string;
  /** The URLs redirected to, in order (the final one last). */
  readonly redirects: readonly string[];
  readonly status: number;
  /** The Content-Type without parameters, lower case. */
  readonly mediaType: string;
  readonly charset: string | undefined;
  readonly kind: PageKind;
  readonly body: Buffer;
  /** The body went on past `maxBytes`; `body` holds the first `maxBytes`. */
  readonly truncated: boolean;
}

export type PageRefusalKind = 'invalid_url' | 'blocked_address' | 'too_many_redirects' | 'timeout' | 'http_error' | 'unsupported_content' | 'network';

export interface PageRefusal {
  readonly kind: PageRefusalKind;
  /** Written for the model: what happened and what it can do instead. */
  readonly message: string;
}

export type PageFetchOutcome = { readonly ok: true; readonly page: FetchedPage } | { readonly ok: false; readonly refusal: PageRefusal };

/** Fetches one page and answers with its readable text or a typed refusal, never a thrown error. */
export interface PageFetcher {
  fetch(url: string, signal: AbortSignal): Promise<PageFetchOutcome>;
}

const REDIRECT_STATUSES: ReadonlySet<number> = new Set([301, 302, 303, 307, 308]);
const HTML_TYPES: ReadonlySet<string> = new Set(['text/html', 'application/xhtml+xml']);
const TEXT_TYPES: ReadonlySet<string> = new Set(['application/json', 'application/xml']);

const REQUEST_HEADERS: OutgoingHttpHeaders = {
  'user-agent': 'Phaseline-fetch_page/1 (research agent)',
  accept: 'text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.1',
  'accept-encoding': 'gzip, deflate, br',
};

function refused(kind: PageRefusalKind, message: string): PageFetchOutcome {
  return { ok: false, refusal: { kind, message } };
}

/** An http(s) URL without credentials or fragment, or the reason it cannot be fetched. */
function targetOf(text: string, base?: URL): { ok: true; url: URL } | { ok: false; outcome: PageFetchOutcome } {
  let url: URL;
  try {
    url = new URL(text, base);
  } catch {
    return { ok: false, outcome: refused('invalid_url', `${JSON.stringify(text)} is not a URL.`) };
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    return { ok: false, outcome: refused('invalid_url', `Only http and https URLs can be fetched, not ${url.protocol.replace(/:$/, '')}.`) };
  }
  if (url.username !== '' || url.password !== '') {
    return { ok: false, outcome: refused('invalid_url', 'URLs with a user name or password are not fetched.') };
  }
  url.hash = '';
  return { ok: true, url };
}

function contentTypeOf(header: string | undefined): { mediaType: string; charset: string | undefined } {
  const [type = '', ...parameters] = (header ?? '').split(';');
  const charset = parameters
    .map((parameter) => /^\s*charset\s*=\s*"?([^";\s]+)"?\s*$/i.exec(parameter)?.[1])
    .find((value) => value !== undefined);
  return { mediaType: type.trim().toLowerCase(), charset: charset?.toLowerCase() };
}

function pageKindOf(mediaType: string): PageKind | undefined {
  if (HTML_TYPES.has(mediaType)) return 'html';
  if (mediaType.startsWith('text/') || TEXT_TYPES.has(mediaType) || mediaType.endsWith('+json') || mediaType.endsWith('+xml')) return 'text';
  return undefined;
}

/** The body decoded per Content-Encoding, or undefined for an encoding we do not read. */
function decodedBody(response: IncomingMessage): Readable | undefined {
  const encoding = (response.headers['content-encoding'] ?? 'identity').trim().toLowerCase();
  const decoder =
    encoding === 'gzip' || encoding === 'x-gzip'
      ? createGunzip()
      : encoding === 'deflate'
        ? createInflate()
        : encoding === 'br'
          ? createBrotliDecompress()
          : undefined;
  if (decoder !== undefined) {
    // Errors of either stream surface through the decoder, where the body is read.
    return pipeline(response, decoder, () => undefined);
  }
  return encoding === 'identity' || encoding === '' ? response : undefined;
}

/** Reads at most `maxBytes`, then stops: the rest of a huge body is never received into memory. */
async function readUpTo(body: Readable, maxBytes: number): Promise<{ body: Buffer; truncated: boolean }> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    const bytes = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string);
    if (size + bytes.length > maxBytes) {
      chunks.push(bytes.subarray(0, maxBytes - size));
      return { body: Buffer.concat(chunks), truncated: true };
    }
    chunks.push(bytes);
    size += bytes.length;
  }
  return { body: Buffer.concat(chunks), truncated: false };
}

/**
 * request-filtering-agent reports a refused address only as an Error whose message says it "is not
 * allowed"; it has no error class or code to test. The wording of the refusal is all that depends
 * on this: either way the fetch fails.
 */
function isAddressRefusal(error: unknown): boolean {
  return error instanceof Error && / is not allowed\. Because/.test(error.message);
}

function describeNetworkError(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as NodeJS.ErrnoException).code;
    return code === undefined ? error.message : `${code} (${error.message})`;
  }
  return String(error);
}

interface FilteringAgents {
  readonly http: RequestFilteringHttpAgent;
  readonly https: RequestFilteringHttpsAgent;
}

function filteringAgents(allowed: readonly string[]): FilteringAgents {
  const filter = { allowIPAddressList: [...allowed], allowPrivateIPAddress: false, allowMetaIPAddress: false };
  return { http: new RequestFilteringHttpAgent(filter), https: new RequestFilteringHttpsAgent(filter) };
}

/** The port a request to `url` connects to. */
function portOf(url: URL): number {
  if (url.port !== '') return Number(url.port);
  return url.protocol === 'https:' ? 443 : 80;
}

class GuardedPageFetcher implements PageFetcher {
  /** For a port no allow-list entry names: public addresses only. */
  private readonly publicOnly = filteringAgents([]);
  /** For each port the allow-list names: public addresses and the entries for that port. */
  private readonly byPort = new Map<number, FilteringAgents>();

  constructor(private readonly limits: PageFetchLimits) {
    const ports = new Set(limits.allowedAddresses.map((entry) => entry.port));
    for (const port of ports) {
      this.byPort.set(port, filteringAgents(limits.allowedAddresses.filter((entry) => entry.port === port).map((entry) => entry.address)));
    }
  }

  async fetch(requestedUrl: string, signal: AbortSignal): Promise<PageFetchOutcome> {
    signal.throwIfAborted();
    const first = targetOf(requestedUrl);
    if (!first.ok) return first.outcome;
    const deadline = AbortSignal.timeout(this.limits.timeoutMs);
    const combined = AbortSignal.any([signal, deadline]);
    let url = first.url;
    const redirects: string[] = [];
    try {
      for (;;) {
        const response = await this.get(url, combined);
        const location = response.headers.location;
        if (REDIRECT_STATUSES.has(response.statusCode ?? 0) && location !== undefined) {
          response.destroy();
          if (redirects.length >= this.limits.maxRedirects) {
            return refused('too_many_redirects', `${requestedUrl} redirected more than ${this.limits.maxRedirects} times; not followed further.`);
          }
          const next = targetOf(location, url);
          if (!next.ok) return next.outcome;
          url = next.url;
          redirects.push(url.href);
          continue;
        }
        return await this.read(requestedUrl, url, redirects, response);
      }
    } catch (error) {
      if (signal.aborted) throw signal.reason;
      if (deadline.aborted) return refused('timeout', `${url.href} did not answer in full within ${this.limits.timeoutMs} ms; gave up.`);
      if (isAddressRefusal(error)) {
        return refused(
          'blocked_address',
          `Refused to connect to ${url.host}: it is a loopback, private, link-local, metadata or otherwise non-public address, not allowed on port ${portOf(url)}. Only public web pages can be fetched.`,
        );
      }
      return refused('network', `Could not fetch ${url.href}: ${describeNetworkError(error)}.`);
    }
  }

  private async read(requestedUrl: string, url: URL, redirects: readonly string[], response: IncomingMessage): Promise<PageFetchOutcome> {
    try {
      const status = response.statusCode ?? 0;
      if (status < 200 || status >= 300) {
        return refused('http_error', `${url.href} answered HTTP ${status}${response.statusMessage ? ` ${response.statusMessage}` : ''}.`);
      }
      const { mediaType, charset } = contentTypeOf(response.headers['content-type']);
      const kind = pageKindOf(mediaType);
      if (kind === undefined) {
        const what = mediaType === '' ? 'no Content-Type' : `Content-Type ${mediaType}`;
        return refused('unsupported_content', `${url.href} answered with ${what}; fetch_page reads only HTML and text pages. Look for an HTML or text version of this source.`);
      }
      const body = decodedBody(response);
      if (body === undefined) {
        return refused('unsupported_content', `${url.href} answered with Content-Encoding ${String(response.headers['content-encoding'])}, which fetch_page cannot decode.`);
      }
      const read = await readUpTo(body, this.limits.maxBytes);
      return { ok: true, page: { requestedUrl, url: url.href, redirects, status, mediaType, charset, kind, body: read.body, truncated: read.truncated } };
    } finally {
      // Stops the transfer of whatever was not read (a redirect's body, an unwanted type, the rest past the cap).
      response.destroy();
    }
  }

  private get(url: URL, signal: AbortSignal): Promise<IncomingMessage> {
    return new Promise((resolve, reject) => {
      const https = url.protocol === 'https:';
      const agents = this.byPort.get(portOf(url)) ?? this.publicOnly;
      const options = { method: 'GET', headers: REQUEST_HEADERS, signal, agent: https ? agents.https : agents.http };
      const request = https ? httpsRequest(url, options, resolve) : httpRequest(url, options, resolve);
      request.on('error', reject);
      request.end();
    });
  }
}

/** A page fetcher that refuses private and loopback addresses (unless allowed), bounds time and size, and extracts readable text. */
export function createPageFetcher(limits: PageFetchLimits): PageFetcher {
  return new GuardedPageFetcher(limits);
}
