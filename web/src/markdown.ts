/**
 * Renders the Markdown of a published report for the chat page, with markdown-it (CommonMark plus
 * tables and strikethrough). Reports are model output, so the output must be safe to put into
 * innerHTML whatever the model wrote:
 *
 * - raw HTML is off: a tag in the source comes out as escaped text, as does every other piece of
 *   text and every attribute value markdown-it writes;
 * - a link target must be an absolute http(s) URL (`isWebUrl`, markdown-it's single gate for
 *   inline, reference, auto- and linkified links); anything else stays plain text;
 * - images are off: a model-chosen image would load from a third party as soon as the report
 *   shows, so `![alt](url)` becomes a link the reader may follow instead;
 * - every link opens in a new tab with `rel="noopener noreferrer"`.
 *
 * No HTML sanitizer runs after it: with raw HTML off, nothing the source contains becomes a tag or
 * attribute other than those markdown-it builds itself, and the only attribute taken from the
 * source that a browser acts on is a link's href, which `isWebUrl` decides.
 *
 * Citations. A report cites inline like `[1]` and ends with numbered references, either as
 * reference definitions (`[1]: https://… "Title"`) or as a list under a "References" heading.
 * Both render as links: numbered citations keep their brackets and link to the source, a citation
 * whose number only a References list names links to that entry's first URL, and definitions,
 * which CommonMark does not display, are listed at the end of the report.
 */
import MarkdownIt, { type Env, type Token } from 'markdown-it';

/** The only link targets a report may have: absolute http(s) URLs. */
export function isWebUrl(href: string): boolean {
  if (!/^https?:\/\//i.test(href.trim())) return false;
  try {
    const url = new URL(href);
    return url.protocol === 'http:' || url.protocol === 'https:';
  } catch {
    return false;
  }
}

/** Headings under which a report lists its sources. */
const REFERENCES_HEADING = /^\s*(references|sources|citations|bibliography|works cited)\s*:?\s*$/i;
/** A reference entry that names its own number: `[3] Title …`. */
const LEADING_CITATION = /^\s*\[(\d{1,4})\]/;
const CITATION_NUMBER = /^\d{1,4}$/;

const renderer = new MarkdownIt('default', { html: false, linkify: true, typographer: false });
// Only URLs written with their scheme become links; "file.name" in prose stays text.
renderer.linkify.set({ fuzzyLink: false, fuzzyEmail: false, fuzzyIP: false });
renderer.validateLink = isWebUrl;
renderer.disable('image');

renderer.renderer.rules.link_open = (tokens, index, options, _env, self) => {
  const token = tokens[index];
  if (token) {
    token.attrSet('target', '_blank');
    token.attrSet('rel', 'noopener noreferrer');
  }
  return self.renderToken(tokens, index, options);
};

/** Shows a numbered citation link as `[1]`, not `1` as CommonMark would, and marks it for styling. */
renderer.core.ruler.push('citations', (state) => {
  const references = state.env.references ?? {};
  for (const block of state.tokens) {
    const children = block.type === 'inline' ? (block.children ?? []) : [];
    for (let index = 0; index + 2 < children.length; index += 1) {
      const [open, label, close] = [children[index], children[index + 1], children[index + 2]];
      if (open?.type !== 'link_open' || label?.type !== 'text' || close?.type !== 'link_close') continue;
      if (!CITATION_NUMBER.test(label.content) || references[label.content]?.href !== open.attrGet('href')) continue;
      label.content = `[${label.content}]`;
      open.attrJoin('class', 'citation');
    }
  }
  return true;
});

/** The first link target in a run of inline tokens. */
function firstLink(children: readonly Token[]): string | null {
  for (const child of children) {
    const href = child.type === 'link_open' ? child.attrGet('href') : null;
    if (href !== null) return String(href);
  }
  return null;
}

interface ReferencesSection {
  /** Whether the report has a References heading at all. */
  readonly present: boolean;
  /** Citation number → the URL its entry links to. */
  readonly targets: ReadonlyMap<string, string>;
}

/**
 * The numbered entries under a References heading, until the next heading of the same or a higher
 * level. An entry's number is its ordered-list number or a leading `[n]`; its target is its first link.
 */
function referencesSection(tokens: readonly Token[]): ReferencesSection {
  const targets = new Map<string, string>();
  let present = false;
  let sectionLevel: number | null = null;
  let itemNumber: string | null = null;
  tokens.forEach((token, index) => {
    if (token.type === 'heading_open') {
      const level = Number(token.tag.slice(1));
      if (sectionLevel !== null && level <= sectionLevel) sectionLevel = null;
      if (REFERENCES_HEADING.test(tokens[index + 1]?.content ?? '')) {
        sectionLevel = level;
        present = true;
      }
      return;
    }
    if (sectionLevel === null || tokens[index - 1]?.type === 'heading_open') return;
    if (token.type === 'list_item_open') itemNumber = token.info === '' ? null : token.info;
    if (token.type !== 'inline') return;
    const number = LEADING_CITATION.exec(token.content)?.[1] ?? itemNumber;
    itemNumber = null;
    const href = firstLink(token.children ?? []);
    if (number !== null && href !== null && !targets.has(number)) targets.set(number, href);
  });
  return { present, targets };
}

const escapeHtml = renderer.utils.escapeHtml;

/** Reference definitions, which CommonMark never displays, as a list at the end of the report. */
function definitionsList(references: NonNullable<Env['references']>, withHeading: boolean): string {
  // Definitions passed isWebUrl when parsed; checked again because this HTML is written here.
  const entries = Object.entries(references).filter(([, reference]) => isWebUrl(reference.href));
  if (entries.length === 0) return '';
  const items = entries.map(([label, { href, title }]) => {
    const number = CITATION_NUMBER.test(label) ? `<span class="reference-label">[${label}]</span> ` : '';
    const link = `<a href="${escapeHtml(href)}" target="_blank" rel="noopener noreferrer">${escapeHtml(title === '' ? href : title)}</a>`;
    return `<li>${number}${link}</li>`;
  });
  return `${withHeading ? '<h2>References</h2>\n' : ''}<ul class="references">\n${items.join('\n')}\n</ul>\n`;
}

export function renderMarkdown(source: string): string {
  // A first parse finds what the report defines and lists; the second resolves `[n]` citations
  // that only a References list names, as if the report had defined them.
  const firstEnv: Env = {};
  const section = referencesSection(renderer.parse(source, firstEnv));
  const defined = firstEnv.references ?? {};
  const listed: NonNullable<Env['references']> = {};
  for (const [number, href] of section.targets) {
    if (defined[number] === undefined) listed[number] = { href, title: '' };
  }
  const env: Env = { references: listed };
  const html = renderer.renderer.render(renderer.parse(source, env), renderer.options, env);
  // Definitions are shown unless a References list already shows the sources.
  return section.targets.size > 0 ? html : html + definitionsList(defined, !section.present);
}
