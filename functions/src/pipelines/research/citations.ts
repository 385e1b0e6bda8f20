/**
 * Citations in the research report. A stored section numbers its own sources (`[k]` in its text
 * cites `sources[k-1]`); the report numbers every source once (the same URL is one source, numbered
 * where the report first cites it) and ends with reference definitions `[n]: <url> "Title"`.
 *
 * URLs, titles and markers come from models and web pages, so all of them pass through here on the
 * way to Markdown: only http(s) sources are kept, a URL is percent-encoded where it could end its
 * `<...>`, a title is put on one line with `"` and `\` escaped, a marker naming no known source is
 * dropped, and the text's own numeric reference definitions are removed (they could point a
 * citation somewhere else).
 */
import { z } from 'zod';
import { sourceKey, titleForText, type NumberedSource } from '../../api';

/** The passage kept per source: enough to show what was relied on, small enough for a section record. */
export const MAX_PASSAGE_CHARS = 500;
const MAX_TITLE_CHARS = 200;

export const storedSource = z.object({ url: z.string(), title: z.string(), passage: z.string(), fetchedAt: z.string() });
export type StoredSource = z.infer<typeof storedSource>;

/** Text whose `[k]` markers cite `sources[k-1]`. */
export interface CitedText {
  readonly text: string;
  readonly sources: readonly StoredSource[];
}

export interface Reference extends StoredSource {
  readonly number: number;
}

/** A `[12]` citation marker (not a link's text `[12](…)`), with the one space before it so a dropped marker takes it along. */
const MARKER = /( ?)\[(\d{1,4})\](?!\()/g;
/** A reference definition with a numeric label, which would claim a citation number. */
const NUMERIC_DEFINITION = /^ {0,3}\[\d{1,4}\]:.*(?:\n|$)/gm;
/** Two markers written together: `[1][2]` is a reference link in Markdown, `[1] [2]` two citations. */
const ADJACENT_MARKERS = /(\[\d{1,4}\])(?=\[\d{1,4}\])/g;

/** Rewrites every citation marker through `renumber`; a null drops the marker. */
export function renumberCitations(text: string, renumber: (cited: number) => number | null): string {
  return text
    .replace(NUMERIC_DEFINITION, '')
    .replace(MARKER, (_marker, space: string, digits: string) => {
      const number = renumber(Number(digits));
      return number === null ? '' : `${space}[${number}]`;
    })
    .replace(ADJACENT_MARKERS, '$1 ');
}

/** The URL as a Markdown link target may hold it, or null when it is not an absolute http(s) URL. */
export function markdownUrl(url: string): string | null {
  let parsed: URL;
  try {
    parsed = new URL(url.trim());
  } catch {
    return null;
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') return null;
  // `href` already encodes spaces, quotes and angle brackets in most places; these are the rest that could end `<...>` or escape.
  return parsed.href.replace(/[\s<>\\]/g, (character) => `%${character.charCodeAt(0).toString(16).toUpperCase().padStart(2, '0')}`);
}

function cutPassage(passage: string): string {
  const line = passage.replace(/\s+/g, ' ').trim();
  if (line.length <= MAX_PASSAGE_CHARS) return line;
  const cut = line.slice(0, MAX_PASSAGE_CHARS - 1);
  const lastSpace = cut.lastIndexOf(' ');
  return `${(lastSpace > MAX_PASSAGE_CHARS / 2 ? cut.slice(0, lastSpace) : cut).trimEnd()}…`;
}

/** What a section record keeps of a source, or null for a source a report cannot link to. */
export function storableSource(source: Pick<StoredSource, 'url' | 'title' | 'passage' | 'fetchedAt'>): StoredSource | null {
  const url = markdownUrl(source.url);
  if (url === null) return null;
  return { url, title: titleForText(source.title, MAX_TITLE_CHARS) || url, passage: cutPassage(source.passage), fetchedAt: source.fetchedAt };
}

/** Collects sources under one numbering, by URL: `add` gives a source's number, new or known. */
class SourceNumbering {
  readonly sources: StoredSource[] = [];
  private readonly numbers = new Map<string, number>();

  add(source: StoredSource): number {
    const key = sourceKey(source.url);
    const known = this.numbers.get(key);
    if (known !== undefined) return known;
    this.sources.push(source);
    this.numbers.set(key, this.sources.length);
    return this.sources.length;
  }
}

/**
 * A section as the model wrote it (citing the numbers its thread showed) → its record: markers
 * renumbered 1.. in the order first cited, only cited sources kept. A text that cites nothing
 * valid gets every source it was shown appended under "Sources consulted", so a model that ignored
 * the instruction still leaves a trace of its evidence.
 */
export function citeSection(text: string, shown: readonly NumberedSource[]): { text: string; sources: StoredSource[] } {
  const byNumber = new Map<number, StoredSource>();
  for (const source of shown) {
    const stored = storableSource(source);
    if (stored !== null && !byNumber.has(source.number)) byNumber.set(source.number, stored);
  }
  const numbering = new SourceNumbering();
  const cited = renumberCitations(text, (number) => {
    const source = byNumber.get(number);
    return source === undefined ? null : numbering.add(source);
  });
  if (numbering.sources.length > 0 || byNumber.size === 0) return { text: cited, sources: numbering.sources };
  const consulted = [...byNumber.values()].map((source) => `[${numbering.add(source)}]`);
  return { text: `${cited.trimEnd()}\n\n*Sources consulted:* ${[...new Set(consulted)].join(' ')}`, sources: numbering.sources };
}

/** Several cited texts under one numbering (a report, or the notes one section combines). */
export function numberCitationsAcross(parts: readonly CitedText[]): { readonly texts: string[]; readonly references: Reference[] } {
  const numbering = new SourceNumbering();
  const texts = parts.map((part) =>
    renumberCitations(part.text, (local) => {
      const source = part.sources[local - 1];
      const stored = source === undefined ? null : storableSource(source);
      return stored === null ? null : numbering.add(stored);
    }),
  );
  return { texts, references: numbering.sources.map((source, index) => ({ ...source, number: index + 1 })) };
}

/** `[n]: <url> "Title"` lines; a reference whose URL is not http(s) is left out. */
export function referenceDefinitions(references: readonly Reference[]): string[] {
  return references.flatMap((reference) => {
    const url = markdownUrl(reference.url);
    if (url === null) return [];
    const title = titleForText(reference.title, MAX_TITLE_CHARS).replace(/["\\]/g, (character) => `\\${character}`);
    return [title === '' ? `[${reference.number}]: <${url}>` : `[${reference.number}]: <${url}> "${title}"`];
  });
}
