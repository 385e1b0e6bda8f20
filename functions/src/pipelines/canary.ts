/**
 * `canary`: a pipeline with no model and no network calls that exercises every engine mechanism
 * (a plain phase, a fan-out with one unit per paragraph, a sectioned phase that yields, and
 * publication). It is how a deployment or the local stack is checked end to end.
 */
import { z } from 'zod';
import { defineFanOutPhase, definePhase, definePipeline } from '../api';

const canaryInput = z.strictObject({
  text: z
    .string()
    .max(20_000)
    .refine((text) => text.trim().length > 0, 'text must contain something besides whitespace'),
});
type CanaryInput = z.infer<typeof canaryInput>;

const MAX_PARAGRAPHS = 50;

const split = definePhase<CanaryInput, { paragraphs: string[] }>({
  name: 'split',
  state: z.object({ paragraphs: z.array(z.string().min(1)).min(1).max(MAX_PARAGRAPHS) }),
  run: (context) => {
    const paragraphs = context.input.text
      .split(/\n\s*\n/)
      .map((paragraph) => paragraph.trim())
      .filter((paragraph) => paragraph.length > 0)
      .slice(0, MAX_PARAGRAPHS);
    context.reportProgress({ paragraphs: paragraphs.length });
    return Promise.resolve({ kind: 'done', state: { paragraphs } });
  },
});

const paragraphStats = z.object({ words: z.number().int(), sentences: z.number().int(), longestWord: z.string() });
type ParagraphStats = z.infer<typeof paragraphStats>;
const measured = z.object({ paragraphs: z.array(paragraphStats) });

const measure = defineFanOutPhase<CanaryInput, z.infer<typeof measured>, ParagraphStats>({
  name: 'measure',
  state: measured,
  needs: [split],
  fanOut: {
    units: (context) => context.checkpoint(split).paragraphs.map((_, index) => `p${String(index).padStart(2, '0')}`),
    unitState: paragraphStats,
    runUnit: (context, unit) => {
      const paragraph = context.checkpoint(split).paragraphs[Number(unit.slice(1))] ?? '';
      const words = paragraph.split(/\s+/).filter(Boolean);
      const longestWord = words.reduce((longest, word) => (word.length > longest.length ? word : longest), '');
      return Promise.resolve({ kind: 'done', state: { words: words.length, sentences: paragraph.split(/[.!?]+(?:\s|$)/).filter((part) => part.trim()).length, longestWord } });
    },
    join: (results) => ({ paragraphs: [...results.keys()].sort().map((unit) => results.get(unit) as ParagraphStats) }),
  },
});

const summarize = definePhase<CanaryInput, { lines: string[] }>({
  name: 'summarize',
  state: z.object({ lines: z.array(z.string()) }),
  section: z.object({ line: z.string() }),
  needs: [measure],
  run: async (context) => {
    const stats = context.checkpoint(measure).paragraphs;
    const recorded = new Set(context.sections().map((section) => section.id));
    for (const [index, paragraph] of stats.entries()) {
      const id = `line-${String(index).padStart(2, '0')}`;
      if (recorded.has(id)) continue;
      if (context.shouldYield()) return { kind: 'yield' };
      const line = `Paragraph ${index + 1}: ${paragraph.words} words, ${paragraph.sentences} sentences, longest word "${paragraph.longestWord}"`;
      await context.recordSection(id, { line });
      context.reportProgress({ sectionsDone: context.sections().length, sectionsTotal: stats.length });
    }
    return { kind: 'done', state: { lines: context.sections().map((section) => (section.data as { line: string }).line) } };
  },
});

export const canaryPipeline = definePipeline<CanaryInput>({
  name: 'canary',
  description: 'Deployment check: text statistics through a fan-out and sections, with no model or network calls.',
  input: canaryInput,
  phases: [split, measure, summarize] as const,
  publish: (context) => {
    const { lines } = context.checkpoint(summarize);
    const words = context.checkpoint(measure).paragraphs.reduce((total, paragraph) => total + paragraph.words, 0);
    return {
      outcome: 'complete',
      title: 'Text statistics',
      markdown: ['# Text statistics', '', `${lines.length} paragraphs, ${words} words.`, '', ...lines.map((line) => `- ${line}`)].join('\n'),
      missing: [],
    };
  },
});
