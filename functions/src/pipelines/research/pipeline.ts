/**
 * `research`: outline → expert perspectives → expert content (one fan-out unit per expert, its
 * sections in order, each given a rolling summary of the ones before) → the final document,
 * section by section → publication. Every section is a checkpoint; a section that fails all its
 * attempts is recorded as skipped and named in the report, which then completes as partial.
 *
 * Built on the agent toolkit (agent/index.ts): each section is one `runAgentSection`. A section's
 * record is not waited for: the next section's first model call starts while it commits, and the
 * engine keeps it on record before the progress reported after it and before the step ends.
 * Citations: each section records the sources it cites (agent/citations.ts); a final section is shown
 * its experts' notes with their sources numbered, and the report numbers every source once and
 * ends with reference definitions.
 */
import { z } from 'zod';
import { agentWait, citeSection, numberCitationsAcross, referenceDefinitions, runAgentSection, storedSource, type AgentDeps, type AgentSectionOutcome, type CitedText } from '../../api';
import { defineFanOutPhase, definePhase, definePipeline, type PhaseOutcome, type StepContext, type UnitOutcome } from '../../api';

/** What research sections run with: the agent toolkit's deps (provider, toolbox, the provider's circuit). */
export type ResearchDeps = AgentDeps;

export const researchInput = z.strictObject({
  question: z.string().trim().min(10, 'question must be at least 10 characters').max(2_000),
  /** Breadth: how many expert perspectives. */
  experts: z.number().int().min(1).max(5).default(3),
  /** Depth: how many sections the report has. */
  sections: z.number().int().min(1).max(6).default(3),
  /** Length: about how many words each section runs to. */
  wordsPerSection: z.number().int().min(50).max(800).default(150),
});
export type ResearchInput = z.output<typeof researchInput>;

// Numbers, not titles or URLs: the runner prints a numbered key under every prompt and tool result
// that shows sources, so the model only copies a short number it can see next to the evidence,
// and the pipeline maps it back to the recorded source (a number it never showed is dropped).
const SYSTEM = [
  'You are a careful research assistant working in a pipeline that writes a report section by section.',
  'Use the tools to find evidence before writing.',
  `A prompt or tool result that shows sources ends with a list headed "Sources (cite as [n]):", one "[n] Title <url>" per line.`,
  'Cite every claim drawn from a source with its number in square brackets right after the claim, for example [2];',
  'cite only numbers you were shown and do not write a reference list.',
  'Answer with the section text only.',
].join(' ');

const FALLBACK_HEADINGS = ['Background', 'What the evidence says', 'Open questions', 'Practical implications', 'Risks and trade-offs', 'Outlook'];
const FALLBACK_EXPERTS = ['a historian of the field', 'a practising engineer', 'an economist', 'a sceptical reviewer', 'a policy analyst'];
const MAX_TOOL_ROUNDS = 6;

/** List items ("1. x", "- x", "* x") of a sensible length, in order. */
export function listItems(text: string): string[] {
  return text
    .split('\n')
    // A heading or a name carries no citation, whatever the model appended.
    .map((line) => /^\s*(?:\d+[.)]|[-*•])\s+(.{3,80})$/.exec(line)?.[1]?.replace(/\s*\[\d{1,4}\]/g, '').trim())
    .filter((item): item is string => item !== undefined && item.length > 0);
}

function pad(items: readonly string[], fallback: readonly string[], count: number): string[] {
  const chosen = [...new Set(items)].slice(0, count);
  for (const candidate of fallback) {
    if (chosen.length >= count) break;
    if (!chosen.includes(candidate)) chosen.push(candidate);
  }
  while (chosen.length < count) chosen.push(`Part ${chosen.length + 1}`);
  return chosen;
}

function firstWords(text: string, words: number): string {
  const parts = text.split(/\s+/).filter(Boolean);
  return parts.length <= words ? parts.join(' ') : `${parts.slice(0, words).join(' ')} …`;
}

type Heading = { id: string; heading: string };
type Expert = { id: string; name: string };

const outlineState = z.object({ title: z.string(), headings: z.array(z.object({ id: z.string(), heading: z.string() })).min(1) });
const perspectivesState = z.object({ experts: z.array(z.object({ id: z.string(), name: z.string() })).min(1) });
// `sources` defaults to none: sections recorded before citations still read.
const expertSection = z.discriminatedUnion('skipped', [
  z.object({ skipped: z.literal(false), headingId: z.string(), text: z.string().min(1), sources: z.array(storedSource).default([]) }),
  z.object({ skipped: z.literal(true), headingId: z.string(), reason: z.string() }),
]);
type ExpertSection = z.infer<typeof expertSection>;
const expertResult = z.object({ sections: z.array(expertSection) });
type ExpertResult = z.infer<typeof expertResult>;
const contentState = z.object({ experts: z.record(z.string(), expertResult) });
const finalSection = z.object({
  headingId: z.string(),
  heading: z.string(),
  /** `[k]` cites `sources[k-1]`. */
  text: z.string(),
  sources: z.array(storedSource).default([]),
  missing: z.boolean(),
  note: z.string().nullable(),
});
type FinalSection = z.output<typeof finalSection>;
const documentState = z.object({ sections: z.array(finalSection) });

/**
 * A planning section: asks for a list of `count` items (`prompt` says what and how many) and gives
 * them back, padded from `fallback`; or how the phase stops first: a provider wait, or the step's
 * time ran out mid-section (its transcript is saved, a new step goes on with it).
 */
async function planList(
  context: StepContext<ResearchInput>,
  deps: ResearchDeps,
  sectionId: string,
  prompt: string,
  count: number,
  fallback: readonly string[],
): Promise<{ readonly items: string[] } | { readonly stop: PhaseOutcome<never> }> {
  const outcome = await runAgentSection(context, deps, { sectionId, promptId: sectionId, system: SYSTEM, prompt, coldContext: '', maxToolRounds: MAX_TOOL_ROUNDS });
  if (outcome.kind === 'provider-wait') return { stop: agentWait(outcome) };
  if (outcome.kind === 'out-of-time') return { stop: { kind: 'yield' } };
  return { items: pad(outcome.kind === 'written' ? listItems(outcome.text) : [], fallback, count) };
}

export function createResearchPipeline(resolveDeps: () => ResearchDeps) {
  const outline = definePhase<ResearchInput, z.infer<typeof outlineState>>({
    name: 'outline',
    state: outlineState,
    run: async (context) => {
      const { question, sections } = context.input;
      const ask = `Plan a report answering: "${question}". List exactly ${sections} section headings, one per line, each starting with "- ".`;
      const planned = await planList(context, resolveDeps(), 'outline', ask, sections, FALLBACK_HEADINGS);
      if ('stop' in planned) return planned.stop;
      const headings = planned.items.map((heading, index) => ({ id: `h${index + 1}`, heading }));
      context.reportProgress({ sectionsTotal: sections });
      return { kind: 'done', state: { title: `Research report: ${question}`, headings } };
    },
  });

  const perspectives = definePhase<ResearchInput, z.infer<typeof perspectivesState>>({
    name: 'perspectives',
    state: perspectivesState,
    needs: [outline],
    run: async (context) => {
      const { question, experts } = context.input;
      const ask = `Who should be consulted on "${question}"? Name exactly ${experts} distinct expert perspectives, one per line, each starting with "- ".`;
      const planned = await planList(context, resolveDeps(), 'perspectives', ask, experts, FALLBACK_EXPERTS);
      if ('stop' in planned) return planned.stop;
      return { kind: 'done', state: { experts: planned.items.map((name, index) => ({ id: `e${index + 1}`, name })) } };
    },
  });

  const expertContent = defineFanOutPhase<ResearchInput, z.infer<typeof contentState>, ExpertResult>({
    name: 'expert-content',
    state: contentState,
    section: expertSection,
    needs: [outline, perspectives],
    fanOut: {
      units: (context) => context.checkpoint(perspectives).experts.map((expert) => expert.id),
      unitState: expertResult,
      runUnit: async (context, unit): Promise<UnitOutcome<ExpertResult>> => {
        const expert = context.checkpoint(perspectives).experts.find((candidate) => candidate.id === unit) as Expert;
        const { headings } = context.checkpoint(outline);
        const recorded = () => context.sections().map((section) => section.data as ExpertSection);
        for (const heading of headings) {
          if (recorded().some((section) => section.headingId === heading.id)) continue; // finished before: reused
          if (context.shouldYield()) return { kind: 'yield' };
          const outcome = await writeExpertSection(context, resolveDeps(), expert, heading, recorded());
          if (outcome.kind === 'provider-wait') return agentWait(outcome);
          if (outcome.kind === 'out-of-time') return { kind: 'yield' };
          const section: ExpertSection =
            outcome.kind === 'written'
              ? { skipped: false, headingId: heading.id, ...citeSection(outcome.text, outcome.sources) }
              : { skipped: true, headingId: heading.id, reason: outcome.reason };
          // Not waited for: the next section's model call starts while it commits (the engine keeps it on record first).
          void context.recordSection(heading.id, section);
          if (section.skipped) context.note('section-skipped', `${expert.name} · ${heading.heading}: skipped after every retry (${section.reason})`);
          const done = recorded();
          context.reportProgress({ sectionsDone: done.length, sectionsTotal: headings.length, sectionsSkipped: done.filter((item) => item.skipped).length });
        }
        return { kind: 'done', state: { sections: recorded() } };
      },
      join: (results) => ({ experts: Object.fromEntries(results) }),
    },
  });

  const finalDocument = definePhase<ResearchInput, z.infer<typeof documentState>>({
    name: 'final-document',
    state: documentState,
    section: finalSection,
    needs: [outline, perspectives, expertContent],
    run: async (context): Promise<PhaseOutcome<z.infer<typeof documentState>>> => {
      const { headings } = context.checkpoint(outline);
      const { experts } = context.checkpoint(perspectives);
      const contributions = context.checkpoint(expertContent).experts;
      const total = headings.length;
      for (const heading of headings) {
        if (context.sections().some((section) => section.id === heading.id)) continue;
        if (context.shouldYield()) return { kind: 'yield' };
        const written = experts.flatMap((expert) => {
          const section = contributions[expert.id]?.sections.find((item) => item.headingId === heading.id);
          return section && !section.skipped ? [{ expert, cited: { text: section.text, sources: section.sources } }] : [];
        });
        // The experts' notes under one numbering, which the section's prompt shows as its sources.
        const notes = numberCitationsAcross(written.map(({ cited }) => cited));
        const noteOf = (index: number): string => notes.texts[index] ?? '';
        let record: FinalSection;
        if (written.length === 0) {
          const reasons = experts.map((expert) => {
            const section = contributions[expert.id]?.sections.find((item) => item.headingId === heading.id);
            return `${expert.name}: ${section?.skipped ? section.reason : 'no contribution'}`;
          });
          record = {
            headingId: heading.id,
            heading: heading.heading,
            text: `*No expert produced this section.* ${reasons.join('; ')}.`,
            sources: [],
            missing: true,
            note: 'no expert contribution',
          };
        } else {
          const outcome = await runAgentSection(context, resolveDeps(), {
            sectionId: heading.id,
            promptId: `final-${heading.id}`,
            system: SYSTEM,
            prompt: [
              `Write the section "${heading.heading}" of the report on "${context.input.question}", about ${context.input.wordsPerSection} words,`,
              'combining these expert notes:',
              ...written.map(({ expert }, index) => `\n[${expert.name}]\n${firstWords(noteOf(index), 400)}`),
            ].join(' '),
            sources: notes.references,
            coldContext: `Report so far: ${context.sections().map((section) => (section.data as { heading: string }).heading).join(', ') || 'nothing yet'}.`,
            maxToolRounds: MAX_TOOL_ROUNDS,
          });
          if (outcome.kind === 'provider-wait') return agentWait(outcome);
          if (outcome.kind === 'out-of-time') return { kind: 'yield' };
          if (outcome.kind === 'written') {
            record = { headingId: heading.id, heading: heading.heading, ...citeSection(outcome.text, outcome.sources), missing: false, note: null };
          } else {
            // Synthesis failed: the expert notes themselves stand in (with their citations), and the report says so.
            const fallback = `*Synthesis skipped (${outcome.reason}); the experts' notes follow.*\n\n${written.map(({ expert }, index) => `**${expert.name}:** ${noteOf(index)}`).join('\n\n')}`;
            record = { headingId: heading.id, heading: heading.heading, ...citeSection(fallback, notes.references), missing: false, note: `synthesis skipped: ${outcome.reason}` };
          }
        }
        // Not waited for: the next section's model call starts while it commits (the engine keeps it on record first).
        void context.recordSection(heading.id, record);
        context.reportProgress({ documentSectionsDone: context.sections().length, sectionsTotal: total });
      }
      return { kind: 'done', state: { sections: context.sections().map((section) => section.data as FinalSection) } };
    },
  });

  return definePipeline<ResearchInput>({
    name: 'research',
    description: 'Deep research: an outline, expert perspectives researched in parallel, then a report written section by section.',
    input: researchInput,
    phases: [outline, perspectives, expertContent, finalDocument],
    publish: (context: StepContext<ResearchInput>) => {
      const { title } = context.checkpoint(outline);
      const { experts } = context.checkpoint(perspectives);
      const contributions = context.checkpoint(expertContent).experts;
      const { sections } = context.checkpoint(finalDocument);
      const missing: string[] = [];
      for (const expert of experts) {
        for (const section of contributions[expert.id]?.sections ?? []) {
          if (section.skipped) missing.push(`${expert.name} · ${sections.find((item) => item.headingId === section.headingId)?.heading ?? section.headingId}`);
        }
      }
      for (const section of sections) if (section.missing) missing.push(`section "${section.heading}"`);
      const markdown = composeReport(title, experts, sections, missing);
      return { outcome: missing.length > 0 ? 'partial' : 'complete', title, markdown, missing };
    },
  });
}

/**
 * The report's Markdown: sections citing one numbering for the whole report, ending with a
 * References heading over the definitions (the page lists them there; a terminal shows the lines).
 */
export function composeReport(title: string, experts: readonly Expert[], sections: readonly (CitedText & { readonly heading: string })[], missing: readonly string[]): string {
  const { texts, references } = numberCitationsAcross(sections);
  const definitions = referenceDefinitions(references);
  return [
    `# ${title}`,
    '',
    `*Perspectives: ${experts.map((expert) => expert.name).join('; ')}.*`,
    '',
    ...sections.flatMap((section, index) => [`## ${section.heading}`, '', texts[index] ?? section.text, '']),
    ...(missing.length > 0 ? ['## Missing from this report', '', ...missing.map((item) => `- ${item}`), ''] : []),
    ...(definitions.length > 0 ? ['## References', '', ...definitions, ''] : []),
  ].join('\n');
}

async function writeExpertSection(
  context: StepContext<ResearchInput>,
  deps: ResearchDeps,
  expert: Expert,
  heading: Heading,
  earlier: readonly ExpertSection[],
): Promise<AgentSectionOutcome> {
  const rolling = earlier
    .map((section) => (section.skipped ? `(${section.headingId} skipped)` : firstWords(section.text, 60)))
    .join('\n');
  return runAgentSection(context, deps, {
    sectionId: heading.id,
    promptId: `${expert.id}-${heading.id}`,
    system: SYSTEM,
    prompt: [
      `You are ${expert.name}. For the report on "${context.input.question}", write the section "${heading.heading}"`,
      `from your perspective, about ${context.input.wordsPerSection} words.`,
      rolling ? `Your earlier sections, in brief:\n${rolling}` : '',
    ].join(' '),
    coldContext: rolling ? `Summary of your earlier sections:\n${rolling}` : 'This is your first section.',
    maxToolRounds: MAX_TOOL_ROUNDS,
  });
}
