/**
 * A deliberately small Markdown renderer for the reports the pipelines write: headings,
 * paragraphs, bullet and numbered lists, block quotes, fenced code, `code`, **strong**, *emphasis*
 * and http(s) links. Every piece of source text is HTML-escaped before any tag is added, so the
 * output can go into innerHTML whatever the model wrote; anything it does not understand comes out
 * as escaped text.
 */

const ESCAPES: Readonly<Record<string, string>> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

export function escapeHtml(value: string): string {
  return value.replace(/[&<>"']/g, (character) => ESCAPES[character] ?? character);
}

/** Emphasis and links on text that is already escaped (the patterns never match `<` or `"`). */
function emphasis(escaped: string): string {
  return escaped
    .replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s()]+)\)/g, (_match, label: string, url: string) => `<a href="${url}" rel="noopener noreferrer" target="_blank">${label}</a>`)
    .replace(/\*\*(?=\S)(.+?)(?<=\S)\*\*/g, '<strong>$1</strong>')
    .replace(/__(?=\S)(.+?)(?<=\S)__/g, '<strong>$1</strong>')
    .replace(/(^|[^*\w])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![*\w])/g, '$1<em>$2</em>')
    .replace(/(^|[^_\w])_(?=[^\s_])(.+?)(?<=[^\s_])_(?![_\w])/g, '$1<em>$2</em>');
}

/** Inline markup: code spans first (nothing inside them is emphasis), then emphasis around them. */
export function renderInline(source: string): string {
  return source
    .split(/(`[^`\n]+`)/g)
    .map((part) => (part.length > 2 && part.startsWith('`') && part.endsWith('`') ? `<code>${escapeHtml(part.slice(1, -1))}</code>` : emphasis(escapeHtml(part))))
    .join('');
}

type ListKind = 'ul' | 'ol';

const HEADING = /^(#{1,6})\s+(.+?)\s*#*\s*$/;
const BULLET = /^\s*[-*+•]\s+(.*)$/;
const NUMBERED = /^\s*\d+[.)]\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const FENCE = /^\s*```/;

export function renderMarkdown(source: string): string {
  const lines = source.replace(/\r\n?/g, '\n').split('\n');
  const html: string[] = [];
  let paragraph: string[] = [];
  // In an object, not a `let`: the flush closures change it, which narrowing cannot see.
  const open: { list: { kind: ListKind; items: string[] } | null } = { list: null };
  let quote: string[] = [];

  const flushParagraph = (): void => {
    if (paragraph.length > 0) html.push(`<p>${renderInline(paragraph.join(' '))}</p>`);
    paragraph = [];
  };
  const flushList = (): void => {
    const list = open.list;
    if (list) html.push(`<${list.kind}>${list.items.map((item) => `<li>${renderInline(item)}</li>`).join('')}</${list.kind}>`);
    open.list = null;
  };
  const flushQuote = (): void => {
    if (quote.length > 0) html.push(`<blockquote><p>${renderInline(quote.join(' '))}</p></blockquote>`);
    quote = [];
  };
  const flushAll = (): void => {
    flushParagraph();
    flushList();
    flushQuote();
  };

  for (let index = 0; index < lines.length; index += 1) {
    const line = lines[index] ?? '';
    if (FENCE.test(line)) {
      flushAll();
      const code: string[] = [];
      index += 1;
      while (index < lines.length && !FENCE.test(lines[index] ?? '')) {
        code.push(lines[index] ?? '');
        index += 1;
      }
      html.push(`<pre><code>${escapeHtml(code.join('\n'))}</code></pre>`);
      continue;
    }
    if (line.trim() === '') {
      flushAll();
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      flushAll();
      const level = heading[1]?.length ?? 1;
      html.push(`<h${level}>${renderInline(heading[2] ?? '')}</h${level}>`);
      continue;
    }
    const bullet = BULLET.exec(line);
    const numbered = bullet ? null : NUMBERED.exec(line);
    if (bullet || numbered) {
      const kind: ListKind = bullet ? 'ul' : 'ol';
      flushParagraph();
      flushQuote();
      if (open.list?.kind !== kind) flushList();
      open.list ??= { kind, items: [] };
      open.list.items.push((bullet ?? numbered)?.[1] ?? '');
      continue;
    }
    const quoted = QUOTE.exec(line);
    if (quoted) {
      flushParagraph();
      flushList();
      quote.push(quoted[1] ?? '');
      continue;
    }
    if (open.list && /^\s{2,}\S/.test(line)) {
      // An indented continuation of the last list item.
      const items = open.list.items;
      items[items.length - 1] = `${items[items.length - 1] ?? ''} ${line.trim()}`;
      continue;
    }
    flushList();
    flushQuote();
    paragraph.push(line.trim());
  }
  flushAll();
  return html.join('\n');
}
