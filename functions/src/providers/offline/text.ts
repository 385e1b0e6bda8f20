/**
 * Small deterministic text helpers shared by the corpus toolbox and the scripted agent: term
 * extraction with a crude stemmer, sentence splitting, word counts and string hashing. Nothing
 * here reads the clock or Math.random, so every result is a pure function of its input.
 */
import { seededRandom } from '../../core/clock';

const STOPWORDS = new Set(
  (
    'a about above after again against all also an and any are around as at be because been before being below between both but by ' +
    'can could did do does doing done each either few for from further had has have having how however i if in into is it its itself ' +
    'just least less many may might more most much must my no nor not now of off on once one only or other our out over own per ' +
    'rather really same several shall should so some such than that the their them then there these they this those through to too ' +
    'two under until up upon us very was we were what when where whether which while who whom why will with within without would ' +
    'yet you your ' +
    // Words of the prompts themselves, not of the subject.
    'answer approximately brief briefly cite describe detail discuss essay explain give include list outline paragraph paragraphs ' +
    'please report research roughly section sentence sentences short source sources summarise summarize summary topic word words write'
  ).split(' '),
);

/** Lower-cases and folds a few plural endings so that "leases" finds "lease" and "retries" finds "retry". */
export function stem(word: string): string {
  if (word.length > 4 && word.endsWith('ies')) return `${word.slice(0, -3)}y`;
  if (word.length > 3 && word.endsWith('s') && !word.endsWith('ss') && !word.endsWith('us')) return word.slice(0, -1);
  return word;
}

/** The content terms of a text: stems of words of three letters or more that are not stopwords or numbers. */
export function contentTerms(text: string): string[] {
  return (text.toLowerCase().match(/[a-z][a-z0-9-]*[a-z0-9]|[a-z]/g) ?? [])
    .flatMap((word) => word.split('-'))
    .filter((word) => word.length >= 3 && !STOPWORDS.has(word))
    .map(stem);
}

/** Distinct content terms, in order of first appearance. */
export function distinctTerms(text: string): string[] {
  return [...new Set(contentTerms(text))];
}

export function splitParagraphs(text: string): string[] {
  return text
    .split(/\n\s*\n/)
    .map((paragraph) => paragraph.replace(/\s+/g, ' ').trim())
    .filter((paragraph) => paragraph.length > 0);
}

/** Sentences of a paragraph, split after `.`, `!` or `?` followed by a space (good enough for the corpus). */
export function splitSentences(paragraph: string): string[] {
  return paragraph
    .split(/(?<=[.!?])\s+(?=["A-Z0-9])/)
    .map((sentence) => sentence.trim())
    .filter((sentence) => sentence.length > 0);
}

export function countWords(text: string): number {
  return text.split(/\s+/).filter((word) => word.length > 0).length;
}

/** 32-bit FNV-1a over the UTF-16 code units of the text, with a selectable offset basis. */
export function hashText(text: string, basis = 0x811c9dc5): number {
  let hash = basis >>> 0;
  for (let index = 0; index < text.length; index += 1) {
    hash ^= text.charCodeAt(index);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash >>> 0;
}

/** A uniform number in [0, 1) that depends only on the seed and the parts. */
export function unitInterval(seed: number, ...parts: readonly (string | number)[]): number {
  return seededRandom((hashText(parts.join('\u001f')) ^ seed) >>> 0)();
}

/** A hex digest of 16 characters (two independent 32-bit hashes); stable across processes. */
export function digest(text: string): string {
  return hashText(text).toString(16).padStart(8, '0') + hashText(text, 0x01234567).toString(16).padStart(8, '0');
}
