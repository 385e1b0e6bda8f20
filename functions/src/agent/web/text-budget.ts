/**
 * Text as a model's budget sees it: bytes decoded by their charset, the token estimate, and text cut
 * to a budget at a paragraph, sentence or word boundary. Kept apart from the page parser (readable.ts,
 * linkedom and Readability), which runs in the extraction worker thread: a step function that never
 * reads a page does not load a DOM at cold start.
 */
import type { PageKind } from './page-fetcher';

export interface ReadablePage {
  readonly title: string;
  readonly text: string;
  /** A short passage that stands for the page: the article's own summary, or its opening. */
  readonly excerpt: string;
}

/** The same estimate as the offline provider's: about four characters a token. */
const CHARS_PER_TOKEN = 4;
/** Where an HTML page may declare its charset without a header (the HTML standard's prescan window). */
const META_PRESCAN_BYTES = 1024;

export function estimateTokens(text: string): number {
  return Math.ceil(text.length / CHARS_PER_TOKEN);
}

/** The header's charset, else (HTML) a `<meta>` one, else UTF-8; an unknown label falls back to UTF-8. */
export function decodeBody(body: Buffer, kind: PageKind, charset: string | undefined): string {
  const declared = charset ?? (kind === 'html' ? metaCharset(body) : undefined);
  try {
    return new TextDecoder(declared ?? 'utf-8').decode(body);
  } catch {
    return new TextDecoder('utf-8').decode(body);
  }
}

function metaCharset(body: Buffer): string | undefined {
  const head = body.subarray(0, META_PRESCAN_BYTES).toString('latin1');
  return /<meta[^>]+charset\s*=\s*["']?([\w-]+)/i.exec(head)?.[1]?.toLowerCase();
}

/** At most `maxChars`, ending at a paragraph, sentence or word boundary when one is near enough. */
export function cutAtBoundary(text: string, maxChars: number): { text: string; cut: boolean } {
  if (text.length <= maxChars) return { text, cut: false };
  const head = text.slice(0, maxChars);
  const floor = Math.floor(maxChars * 0.6);
  const boundaries = [head.lastIndexOf('\n\n'), Math.max(head.lastIndexOf('. '), head.lastIndexOf('.\n')) + 1, head.lastIndexOf(' ')];
  const end = boundaries.find((index) => index >= floor) ?? maxChars;
  return { text: `${head.slice(0, end).trimEnd()} …`, cut: true };
}

/** The text within `tokenBudget` estimated tokens, and whether anything was left out. */
export function cutToTokens(text: string, tokenBudget: number): { text: string; cut: boolean } {
  return cutAtBoundary(text, tokenBudget * CHARS_PER_TOKEN);
}
