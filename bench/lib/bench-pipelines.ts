/** Two tiny pipelines the bench defines for the scenarios that measure the engine, not the agent. */
import { z } from 'zod';
import { definePhase, definePipeline, pipelineRegistry, type PipelineRegistry } from '../../functions/src/core/pipeline';

/** One phase that finishes at once: a claim, an empty phase, a hand-off. */
const noopPhase = definePhase<Record<string, never>, { ok: true }>({
  name: 'noop',
  state: z.object({ ok: z.literal(true) }),
  run: () => Promise.resolve({ kind: 'done', state: { ok: true } }),
});

export const noopPipeline = definePipeline<Record<string, never>>({
  name: 'bench-noop',
  description: 'Bench: one empty phase.',
  input: z.strictObject({}),
  phases: [noopPhase],
  publish: () => ({ outcome: 'complete', title: 'noop', markdown: 'noop', missing: [] }),
});

const burstInput = z.strictObject({ sections: z.number().int().min(1).max(1_000), intervalMs: z.number().int().min(0).max(10_000) });
type BurstInput = z.infer<typeof burstInput>;

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** One phase that records `sections` sections, one every `intervalMs`, reporting progress after each. */
const burstPhase = definePhase<BurstInput, { sections: number }>({
  name: 'burst',
  state: z.object({ sections: z.number().int() }),
  section: z.object({ index: z.number().int() }),
  run: async (context) => {
    for (let index = 0; index < context.input.sections; index += 1) {
      const id = `s${String(index).padStart(4, '0')}`;
      if (context.sections().some((section) => section.id === id)) continue;
      await sleep(context.input.intervalMs);
      await context.recordSection(id, { index });
      context.reportProgress({ sectionsDone: context.sections().length, sectionsTotal: context.input.sections });
    }
    return { kind: 'done', state: { sections: context.sections().length } };
  },
});

export const burstPipeline = definePipeline<BurstInput>({
  name: 'bench-burst',
  description: 'Bench: sections recorded at a fixed rate.',
  input: burstInput,
  phases: [burstPhase],
  publish: (context) => ({ outcome: 'complete', title: 'burst', markdown: `${context.checkpoint(burstPhase).sections} sections`, missing: [] }),
});

export const benchPipelines: PipelineRegistry = pipelineRegistry<[Record<string, never>, BurstInput]>(noopPipeline, burstPipeline);
