/**
 * How deep and how big a page's element tree will be, measured by one linear pass over the markup
 * before anything parses it. linkedom (through htmlparser2) builds the tree the way this pass
 * counts it: void elements have no children, an end tag closes up to the nearest open element of
 * its name, some start tags close the element they cannot sit in (a `<li>` closes an open `<li>`, a
 * block closes an open `<p>`), `/>` closes only inside SVG or MathML, and script, style, title,
 * textarea and xmp hold text, not tags. Where the pass is unsure it counts deeper, never shallower.
 *
 * Readability's time grows with depth times size, and the text walk recurses once per level, so a
 * page of a few thousand nested elements costs minutes of CPU (test/unit/web-tools-fetch.test.ts
 * builds such pages). Real pages stay far inside these limits: browsers' own parsers cap nesting at
 * 512, and a long article is tens of thousands of elements.
 */

export interface MarkupLimits {
  /** Open elements one inside another. */
  readonly maxDepth: number;
  readonly maxElements: number;
}

export const DEFAULT_MARKUP_LIMITS: MarkupLimits = { maxDepth: 256, maxElements: 150_000 };

export interface MarkupShape {
  /** The deepest nesting seen (stops growing once a limit is passed). */
  readonly depth: number;
  readonly elements: number;
  /** The first limit the page passed; the pass stops there. */
  readonly over?: 'depth' | 'elements';
}

const VOID = new Set(['area', 'base', 'basefont', 'br', 'col', 'command', 'embed', 'frame', 'hr', 'img', 'input', 'isindex', 'keygen', 'link', 'meta', 'param', 'source', 'track', 'wbr']);
/** Their content is text up to their own end tag. */
const RAW_TEXT = new Set(['script', 'style', 'title', 'textarea', 'xmp']);
const FOREIGN = new Set(['svg', 'math']);
/** HTML again inside SVG or MathML. */
const INTEGRATION = new Set(['mi', 'mo', 'mn', 'ms', 'mtext', 'annotation-xml', 'foreignobject', 'desc', 'title']);

const P = new Set(['p']);
const FORM_CONTROLS = new Set(['input', 'option', 'optgroup', 'select', 'button', 'datalist', 'textarea']);
/** The open elements a start tag closes first, innermost outward, while they are the innermost one. */
const CLOSED_BY: ReadonlyMap<string, ReadonlySet<string>> = new Map<string, ReadonlySet<string>>([
  ['tr', new Set(['tr', 'th', 'td'])],
  ['th', new Set(['th'])],
  ['td', new Set(['thead', 'th', 'td'])],
  ['body', new Set(['head', 'link', 'script'])],
  ['li', new Set(['li'])],
  ['option', new Set(['option'])],
  ['optgroup', new Set(['optgroup', 'option'])],
  ['dd', new Set(['dd', 'dt'])],
  ['dt', new Set(['dd', 'dt'])],
  ['rt', new Set(['rt', 'rp'])],
  ['rp', new Set(['rt', 'rp'])],
  ['tbody', new Set(['thead', 'tbody'])],
  ['tfoot', new Set(['thead', 'tbody'])],
  ...['select', 'input', 'output', 'button', 'datalist', 'textarea'].map((name): [string, ReadonlySet<string>] => [name, FORM_CONTROLS]),
  ...['p', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'address', 'article', 'aside', 'blockquote', 'details', 'div', 'dl', 'fieldset', 'figcaption', 'figure', 'footer', 'form', 'header', 'hr', 'main', 'nav', 'ol', 'pre', 'section', 'table', 'ul'].map(
    (name): [string, ReadonlySet<string>] => [name, P],
  ),
]);

const isLetter = (code: number): boolean => (code >= 65 && code <= 90) || (code >= 97 && code <= 122);
const isSpace = (code: number): boolean => code === 32 || (code >= 9 && code <= 13);

/** One pass over the markup; stops at the first limit passed. */
export function measureMarkup(html: string, limits: MarkupLimits = DEFAULT_MARKUP_LIMITS): MarkupShape {
  const open: string[] = [];
  /** Per open element: inside SVG or MathML (where `/>` closes). */
  const foreign: boolean[] = [];
  let depth = 0;
  let elements = 0;
  const pop = (): void => {
    open.pop();
    foreign.pop();
  };
  let index = 0;
  for (;;) {
    const start = html.indexOf('<', index);
    if (start < 0) break;
    const next = html.charCodeAt(start + 1);
    if (html.startsWith('!--', start + 1)) {
      const end = html.indexOf('-->', start + 4);
      index = end < 0 ? html.length : end + 3;
      continue;
    }
    if (next === 33 /* ! */ || next === 63 /* ? */) {
      const end = html.indexOf('>', start + 2);
      index = end < 0 ? html.length : end + 1;
      continue;
    }
    const closing = next === 47; /* / */
    const nameStart = start + (closing ? 2 : 1);
    if (!isLetter(html.charCodeAt(nameStart))) {
      index = start + 1;
      continue;
    }
    let nameEnd = nameStart + 1;
    while (nameEnd < html.length) {
      const code = html.charCodeAt(nameEnd);
      if (isSpace(code) || code === 47 || code === 62) break;
      nameEnd += 1;
    }
    const name = html.slice(nameStart, nameEnd).toLowerCase();
    const tag = tagEnd(html, nameEnd);
    index = tag.end;
    if (closing) {
      const at = open.lastIndexOf(name);
      while (at >= 0 && open.length > at) pop();
      continue;
    }
    elements += 1;
    if (elements > limits.maxElements) return { depth, elements, over: 'elements' };
    const closes = CLOSED_BY.get(name);
    if (closes !== undefined) while (open.length > 0 && closes.has(open[open.length - 1] ?? '')) pop();
    // A void or self-closed element sits at this depth too, only without children.
    depth = Math.max(depth, open.length + 1);
    if (depth > limits.maxDepth) return { depth, elements, over: 'depth' };
    const inForeign = foreign[foreign.length - 1] ?? false;
    if (VOID.has(name) || (tag.selfClosing && inForeign)) continue;
    if (RAW_TEXT.has(name)) {
      // Text up to its end tag (in SVG too, as htmlparser2 reads it): nothing inside is markup.
      const pattern = rawTextEnd(name);
      pattern.lastIndex = index;
      index = pattern.test(html) ? pattern.lastIndex : html.length;
      continue;
    }
    open.push(name);
    foreign.push(FOREIGN.has(name) ? true : INTEGRATION.has(name) ? false : inForeign);
  }
  return { depth, elements };
}

const rawTextEnds = new Map<string, RegExp>();
function rawTextEnd(name: string): RegExp {
  let pattern = rawTextEnds.get(name);
  if (pattern === undefined) {
    pattern = new RegExp(`</${name}`, 'ig');
    rawTextEnds.set(name, pattern);
  }
  return pattern;
}

/** Where a tag's `>` is (quoted attribute values may hold one), and whether it ends in `/>`. */
function tagEnd(html: string, from: number): { end: number; selfClosing: boolean } {
  let index = from;
  let afterEquals = false;
  while (index < html.length) {
    const code = html.charCodeAt(index);
    if (code === 62 /* > */) return { end: index + 1, selfClosing: html.charCodeAt(index - 1) === 47 };
    if (afterEquals && (code === 34 || code === 39)) {
      const close = html.indexOf(code === 34 ? '"' : "'", index + 1);
      if (close < 0) return { end: html.length, selfClosing: false };
      index = close + 1;
      afterEquals = false;
      continue;
    }
    if (code === 61 /* = */) afterEquals = true;
    else if (!isSpace(code)) afterEquals = false;
    index += 1;
  }
  return { end: html.length, selfClosing: false };
}
