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
/** The parser's whitespace: space, tab, line feed, form feed, carriage return (not vertical tab). */
const isSpace = (code: number): boolean => code === 32 || code === 9 || code === 10 || code === 12 || code === 13;
const GT = 62;
const SLASH = 47;

/**
 * One pass over the markup; stops at the first limit passed. It follows htmlparser2's tokenizer and
 * tree rules where they decide nesting: where a comment, CDATA section, declaration, tag or raw text
 * ends; that `/>` closes only while the parser's foreign-content flag is set (a stack of its own,
 * pushed by svg, math and their HTML integration points, and shifted by any end tag of those names,
 * open or not); that a self-closed raw-text tag (`<style/>`) is an open element whose content is
 * markup; and that a stray `</p>` or `</br>` makes an element.
 */
export function measureMarkup(html: string, limits: MarkupLimits = DEFAULT_MARKUP_LIMITS): MarkupShape {
  const open: string[] = [];
  /** The parser's foreign-content flags, innermost last; its base is HTML. */
  const foreign: boolean[] = [false];
  let depth = 0;
  let elements = 0;
  /** Counts an element at the current depth; the limit it passes, if any. */
  const counted = (): 'depth' | 'elements' | undefined => {
    elements += 1;
    if (elements > limits.maxElements) return 'elements';
    depth = Math.max(depth, open.length + 1);
    return depth > limits.maxDepth ? 'depth' : undefined;
  };
  let index = 0;
  for (;;) {
    const start = html.indexOf('<', index);
    if (start < 0) break;
    const next = html.charCodeAt(start + 1);
    if (next === 33 /* ! */) {
      index = declarationEnd(html, start);
      continue;
    }
    if (next === 63 /* ? */) {
      index = after(html, '>', start + 2);
      continue;
    }
    if (next === SLASH) {
      let nameStart = start + 2;
      while (nameStart < html.length && isSpace(html.charCodeAt(nameStart))) nameStart += 1;
      if (html.charCodeAt(nameStart) === GT) {
        index = nameStart + 1;
        continue;
      }
      // An end tag's name runs to `>` or whitespace; anything else after `</` is a bogus comment up to `>`.
      if (!isLetter(html.charCodeAt(nameStart))) {
        index = after(html, '>', nameStart);
        continue;
      }
      let nameEnd = nameStart + 1;
      while (nameEnd < html.length && !isSpace(html.charCodeAt(nameEnd)) && html.charCodeAt(nameEnd) !== GT) nameEnd += 1;
      index = after(html, '>', nameEnd);
      const over = closeTag(html.slice(nameStart, nameEnd).toLowerCase());
      if (over !== undefined) return { depth, elements, over };
      continue;
    }
    const nameStart = start + 1;
    if (!isLetter(html.charCodeAt(nameStart))) {
      index = nameStart;
      continue;
    }
    let nameEnd = nameStart + 1;
    while (nameEnd < html.length) {
      const code = html.charCodeAt(nameEnd);
      if (isSpace(code) || code === SLASH || code === GT) break;
      nameEnd += 1;
    }
    const name = html.slice(nameStart, nameEnd).toLowerCase();
    const tag = tagEnd(html, nameEnd);
    index = tag.end;
    const closes = CLOSED_BY.get(name);
    if (closes !== undefined) while (open.length > 0 && closes.has(open[open.length - 1] ?? '')) open.pop();
    // A void or self-closed element sits at this depth too, only without children.
    const over = counted();
    if (over !== undefined) return { depth, elements, over };
    if (VOID.has(name)) continue;
    if (FOREIGN.has(name)) foreign.push(true);
    else if (INTEGRATION.has(name)) foreign.push(false);
    if (tag.selfClosing && foreign[foreign.length - 1] === true) continue;
    if (RAW_TEXT.has(name) && !tag.selfClosing) {
      // Text up to its end tag (in SVG too, as htmlparser2 reads it): nothing inside is markup.
      const end = rawTextEnd(html, name, index);
      if (end < 0) break;
      index = after(html, '>', end);
      if (FOREIGN.has(name) || INTEGRATION.has(name)) foreign.pop();
      continue;
    }
    open.push(name);
  }
  return { depth, elements };

  /** An end tag as the parser takes it; the limit it passes, if any. */
  function closeTag(name: string): 'depth' | 'elements' | undefined {
    if (FOREIGN.has(name) || INTEGRATION.has(name)) foreign.pop();
    if (VOID.has(name)) return name === 'br' ? counted() : undefined;
    const at = open.lastIndexOf(name);
    if (at >= 0) {
      open.length = at;
      return undefined;
    }
    return name === 'p' ? counted() : undefined;
  }
}

/** Just past the next `text` at or after `from`, or the end of the markup. */
function after(html: string, text: string, from: number): number {
  const at = html.indexOf(text, from);
  return at < 0 ? html.length : at + text.length;
}

/** Where `<!…` ends: a comment at `-->` (which may share the dashes of `<!--`), CDATA at `]]>`, a declaration at `>`. */
function declarationEnd(html: string, start: number): number {
  if (html.startsWith('--', start + 2)) return after(html, '-->', start + 2);
  if (html.startsWith('[CDATA[', start + 2)) return after(html, ']]>', start + 9);
  return after(html, '>', start + 2);
}

/** Where the end tag of a raw-text element starts (`</name` then whitespace or `>`, any case), or -1. */
function rawTextEnd(html: string, name: string, from: number): number {
  const pattern = rawTextEnds.get(name) ?? new RegExp(`</${name}[\\t\\n\\f\\r >]`, 'ig');
  rawTextEnds.set(name, pattern);
  pattern.lastIndex = from;
  const match = pattern.exec(html);
  return match === null ? -1 : match.index + 2 + name.length;
}

const rawTextEnds = new Map<string, RegExp>();

/**
 * Where a start tag's `>` is and whether the tag is self-closing, read as htmlparser2 reads
 * attributes: a value opened by a quote right after `=` (spaces between allowed) runs to its closing
 * quote; an unquoted value runs to whitespace or `>`, `/` included; `/` then whitespace then `>` still
 * self-closes.
 */
function tagEnd(html: string, from: number): { end: number; selfClosing: boolean } {
  type State = 'between' | 'name' | 'afterName' | 'beforeValue' | 'unquoted' | 'slash';
  let state: State = 'between';
  for (let index = from; index < html.length; index += 1) {
    const code = html.charCodeAt(index);
    switch (state) {
      case 'between':
        if (code === GT) return { end: index + 1, selfClosing: false };
        if (code === SLASH) state = 'slash';
        else if (!isSpace(code)) state = 'name';
        break;
      case 'slash':
        if (code === GT) return { end: index + 1, selfClosing: true };
        if (code === SLASH) state = 'slash';
        else if (!isSpace(code)) state = 'name';
        break;
      case 'name':
        if (code === 61 /* = */) state = 'beforeValue';
        else if (code === GT) return { end: index + 1, selfClosing: false };
        else if (code === SLASH) state = 'slash';
        else if (isSpace(code)) state = 'afterName';
        break;
      case 'afterName':
        if (code === 61) state = 'beforeValue';
        else if (code === GT) return { end: index + 1, selfClosing: false };
        else if (code === SLASH) state = 'slash';
        else if (!isSpace(code)) state = 'name';
        break;
      case 'beforeValue':
        if (code === 34 || code === 39) {
          const close = html.indexOf(code === 34 ? '"' : "'", index + 1);
          if (close < 0) return { end: html.length, selfClosing: false };
          index = close;
          state = 'between';
        } else if (code === GT) return { end: index + 1, selfClosing: false };
        else if (!isSpace(code)) state = 'unquoted';
        break;
      case 'unquoted':
        if (code === GT) return { end: index + 1, selfClosing: false };
        if (isSpace(code)) state = 'between';
        break;
    }
  }
  return { end: html.length, selfClosing: false };
}
