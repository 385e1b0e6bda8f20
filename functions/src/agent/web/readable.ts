/**
 * A fetched page as text a model can read: HTML reduced to its readable article (Mozilla's
 * Readability on a linkedom DOM: no browser, no network). Loaded only by the extraction worker
 * thread (readable-worker.ts); the budget helpers are in text-budget.ts.
 */
import { Readability } from '@mozilla/readability';
import { parseHTML } from 'linkedom';
import { cutAtBoundary, type ReadablePage } from './text-budget';

const EXCERPT_CHARS = 300;

/** The structural view of a DOM node the text walk needs (linkedom's nodes have it). */
interface TextNode {
  readonly nodeType: number;
  readonly nodeName: string;
  readonly textContent: string | null;
  readonly childNodes: ArrayLike<TextNode>;
}

const ELEMENT_NODE = 1;
const TEXT_NODE = 3;
const SKIPPED = new Set(['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE', 'SVG', 'IFRAME', 'HEAD']);
const BLOCKS = new Set([
  'ADDRESS', 'ARTICLE', 'ASIDE', 'BLOCKQUOTE', 'BR', 'DD', 'DIV', 'DL', 'DT', 'FIGCAPTION', 'FIGURE', 'FOOTER', 'FORM', 'H1', 'H2', 'H3',
  'H4', 'H5', 'H6', 'HEADER', 'HR', 'LI', 'MAIN', 'NAV', 'OL', 'P', 'PRE', 'SECTION', 'TABLE', 'TBODY', 'TD', 'TH', 'THEAD', 'TR', 'UL',
]);

/** Text with a line break around each block element, so paragraphs and list items stay apart. */
function blockText(root: TextNode): string {
  const parts: string[] = [];
  const visit = (node: TextNode, preformatted: boolean): void => {
    if (node.nodeType === TEXT_NODE) {
      // Source line breaks inside a paragraph are only layout; inside <pre> they are content.
      const text = node.textContent ?? '';
      parts.push(preformatted ? text : text.replace(/\s+/g, ' '));
      return;
    }
    if (node.nodeType !== ELEMENT_NODE && node.nodeType !== 9 && node.nodeType !== 11) return;
    const name = node.nodeName.toUpperCase();
    if (SKIPPED.has(name)) return;
    const block = BLOCKS.has(name);
    if (block) parts.push('\n');
    // Read once: linkedom builds `childNodes` afresh on each access, so indexing it in the loop is quadratic in the siblings.
    const children = Array.from(node.childNodes);
    for (const child of children) visit(child, preformatted || name === 'PRE');
    if (block) parts.push('\n');
  };
  visit(root, false);
  return normalizeText(parts.join(''));
}

/** Spaces collapsed within lines, lines trimmed, never more than one blank line in a row. */
function normalizeText(text: string): string {
  return text
    .replace(/\r\n?/g, '\n')
    .split('\n')
    .map((line) => line.replace(/[ \t\f\v\u00a0]+/g, ' ').trim())
    .join('\n')
    .replace(/\n{3,}/g, '\n\n')
    .trim();
}

function excerptOf(text: string, own: string | null | undefined): string {
  const summary = own?.replace(/\s+/g, ' ').trim();
  if (summary !== undefined && summary.length >= 40) return cutAtBoundary(summary, EXCERPT_CHARS).text;
  return cutAtBoundary(text.replace(/\s+/g, ' '), EXCERPT_CHARS).text;
}

/** A parsed document as this module uses it. */
interface ParsedDocument extends TextNode {
  readonly title: string;
  readonly body: TextNode | null;
  readonly documentElement: TextNode;
}

interface Article {
  readonly title?: string | null;
  readonly content?: TextNode | null;
  readonly excerpt?: string | null;
}

// Both libraries type their DOM with the browser's lib.dom names, which this server-side project
// does not load; these are the same functions, seen through the structural types above.
const parseDocument = parseHTML as unknown as (html: string) => { readonly document: ParsedDocument };
const ArticleReader = Readability as unknown as new (
  document: ParsedDocument,
  options: { readonly serializer: (node: TextNode) => TextNode },
) => { parse(): Article | null };

/**
 * Readability runs synchronously, and on linkedom its time grows much faster than the page: measured
 * here, about 0.2 s for a typical article of 3,000 elements, but 2 s for 2,000 elements that are all
 * siblings and 12 s for 8,000. Past these bounds the page gets the linear walk instead, so one page
 * cannot hold the event loop (and the step's heartbeat) for long.
 */
const READABILITY_MAX_ELEMENTS = 3_000;
const READABILITY_MAX_TEXT_CHARS = 300_000;
/** Boilerplate the linear walk leaves out when Readability is not used. */
const BOILERPLATE = 'nav, header, footer, aside, form, [role="navigation"], [role="banner"], [role="contentinfo"]';

interface QueryableDocument extends ParsedDocument {
  querySelectorAll(selector: string): ArrayLike<TextNode & { remove(): void }>;
  querySelector(selector: string): TextNode | null;
}

/** The page's article (or, when Readability finds none or the page is too big for it, its main text) as text. */
export function readableFromHtml(html: string): ReadablePage {
  const { document } = parseDocument(html);
  const documentTitle = document.title.trim();
  const queryable = document as QueryableDocument;
  const small = queryable.querySelectorAll('*').length <= READABILITY_MAX_ELEMENTS && (document.body?.textContent?.length ?? 0) <= READABILITY_MAX_TEXT_CHARS;
  if (small) {
    // Readability edits the document it is given; the fallback below reads a fresh one.
    const article = new ArticleReader(document, { serializer: (node) => node }).parse();
    const articleText = article?.content ? blockText(article.content) : '';
    if (article !== null && articleText !== '') {
      return { title: article.title?.trim() || documentTitle, text: articleText, excerpt: excerptOf(articleText, article.excerpt) };
    }
  }
  const fresh = (small ? parseDocument(html).document : document) as QueryableDocument;
  for (const node of Array.from(fresh.querySelectorAll(BOILERPLATE))) node.remove();
  const main = fresh.querySelector('article') ?? fresh.querySelector('main') ?? fresh.body ?? fresh.documentElement;
  const text = blockText(main);
  return { title: documentTitle, text, excerpt: excerptOf(text, undefined) };
}

export function readableFromText(text: string): ReadablePage {
  const normalized = normalizeText(text);
  const firstLine = normalized.split('\n', 1)[0]?.trim() ?? '';
  return { title: firstLine.length <= 120 ? firstLine : '', text: normalized, excerpt: excerptOf(normalized, undefined) };
}

