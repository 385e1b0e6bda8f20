/** A two-phase pipeline whose behaviour each test sets, for driving the engine through its cases. */
import { z } from 'zod';
import type { PhaseOutcome, StepContext } from '../../functions/src/core/pipeline';
import { definePhase, definePipeline, pipelineRegistry } from '../../functions/src/core/pipeline';

export type TestInput = { sections: number };
type FirstState = { sections: number };
type SecondState = { total: number };

export interface Behaviour {
  first: (context: StepContext<TestInput>) => Promise<PhaseOutcome<FirstState>>;
  second: (context: StepContext<TestInput>) => Promise<PhaseOutcome<SecondState>>;
  /** Executions of each section's work, by section ID (the work, not the recording). */
  sectionRuns: Map<string, number>;
  publishes: number;
}

export const firstPhase = definePhase<TestInput, FirstState>({
  name: 'first',
  state: z.strictObject({ sections: z.number().int().min(1) }),
  run: (context) => behaviour.first(context),
});

export const secondPhase = definePhase<TestInput, SecondState>({
  name: 'second',
  state: z.strictObject({ total: z.number().int() }),
  section: z.strictObject({ value: z.number().int() }),
  needs: [firstPhase],
  run: (context) => behaviour.second(context),
});

/** The default second phase: one section per index, skipping the recorded ones, yielding when told. */
export async function recordSections(context: StepContext<TestInput>): Promise<PhaseOutcome<SecondState>> {
  const { sections } = context.checkpoint(firstPhase);
  const recorded = new Set(context.sections().map((section) => section.id));
  for (let index = 0; index < sections; index += 1) {
    const id = `s${index}`;
    if (recorded.has(id)) continue;
    if (context.shouldYield()) return { kind: 'yield' };
    behaviour.sectionRuns.set(id, (behaviour.sectionRuns.get(id) ?? 0) + 1);
    await context.recordSection(id, { value: index * 10 });
    context.reportProgress({ sectionsDone: context.sections().length, sectionsTotal: sections });
  }
  const total = context.sections().reduce((sum, section) => sum + (section.data as { value: number }).value, 0);
  return { kind: 'done', state: { total } };
}

export const behaviour: Behaviour = {
  first: (context) => Promise.resolve({ kind: 'done', state: { sections: context.input.sections } }),
  second: recordSections,
  sectionRuns: new Map(),
  publishes: 0,
};

export function resetBehaviour(): void {
  behaviour.first = (context) => Promise.resolve({ kind: 'done', state: { sections: context.input.sections } });
  behaviour.second = recordSections;
  behaviour.sectionRuns = new Map();
  behaviour.publishes = 0;
}

export const testPipeline = definePipeline<TestInput>({
  name: 'two-phase',
  description: 'Test pipeline: a plain phase, then a sectioned one',
  input: z.strictObject({ sections: z.number().int().min(1).max(20) }),
  phases: [firstPhase, secondPhase],
  publish: (context) => {
    behaviour.publishes += 1;
    return { outcome: 'complete', title: 'Total', markdown: `total ${context.checkpoint(secondPhase).total}`, missing: [] };
  },
});

export const testPipelines = pipelineRegistry(testPipeline);
