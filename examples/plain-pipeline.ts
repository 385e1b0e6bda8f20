/**
 * Example (a): a plain pipeline. It turns a topic and a list of points into a short outline, in
 * two phases: `plan` checkpoints the headings; `write` records one section per heading, so a step
 * that runs out of time (or a worker that dies) resumes at the first heading not yet recorded, and
 * what was recorded is never written again.
 *
 * Deploy it from your functions index:
 *
 *     import { createPhaseline } from 'phaseline';
 *     import { outlinePipeline } from './outline';
 *     export const { submitJob, runJobStep, sweepJobs, cancelJob, decideJob, opsAction } =
 *       createPhaseline({ pipelines: [outlinePipeline] });
 */
import { z } from 'zod';
import { definePhase, definePipeline } from 'phaseline';

const outlineInput = z.strictObject({
  topic: z.string().trim().min(1).max(200),
  points: z.array(z.string().trim().min(1).max(200)).min(1).max(20),
});
type OutlineInput = z.infer<typeof outlineInput>;

const plan = definePhase<OutlineInput, { headings: string[] }>({
  name: 'plan',
  state: z.object({ headings: z.array(z.string().min(1)).min(1) }),
  run: (context) => {
    const headings = context.input.points.map((point, index) => `${index + 1}. ${point[0]?.toUpperCase() ?? ''}${point.slice(1)}`);
    context.reportProgress({ sectionsTotal: headings.length });
    return Promise.resolve({ kind: 'done', state: { headings } });
  },
});

const paragraph = z.object({ heading: z.string(), text: z.string() });

const write = definePhase<OutlineInput, { paragraphs: z.infer<typeof paragraph>[] }>({
  name: 'write',
  state: z.object({ paragraphs: z.array(paragraph) }),
  section: paragraph,
  needs: [plan],
  run: async (context) => {
    const { headings } = context.checkpoint(plan);
    const recorded = new Set(context.sections().map((section) => section.id));
    for (const [index, heading] of headings.entries()) {
      const id = `heading-${index}`;
      if (recorded.has(id)) continue; // written by an earlier step: never again
      if (context.shouldYield()) return { kind: 'yield' }; // the next task carries on from here
      const text = `How "${heading.slice(heading.indexOf(' ') + 1)}" bears on ${context.input.topic}.`;
      await context.recordSection(id, { heading, text });
      context.reportProgress({ sectionsDone: context.sections().length });
    }
    return { kind: 'done', state: { paragraphs: context.sections().map((section) => paragraph.parse(section.data)) } };
  },
});

/** `outline`: a topic and its points in, a markdown outline out. */
export const outlinePipeline = definePipeline<OutlineInput>({
  name: 'outline',
  description: 'A markdown outline of a topic, one recorded section per point.',
  input: outlineInput,
  phases: [plan, write],
  publish: (context) => {
    const { paragraphs } = context.checkpoint(write);
    const title = `Outline: ${context.input.topic}`;
    const body = paragraphs.flatMap(({ heading, text }) => [`## ${heading}`, '', text, '']);
    return { outcome: 'complete', title, markdown: [`# ${title}`, '', ...body].join('\n'), missing: [] };
  },
});
