// A project's whole functions index: one pipeline, and the deployed functions Phaseline builds from it.
import { z } from 'zod';
import { createPhaseline, definePhase, definePipeline } from 'phaseline';

const input = z.strictObject({ names: z.array(z.string().min(1)).min(1).max(10) });
type Input = z.infer<typeof input>;

const greet = definePhase<Input, { greetings: string[] }>({
  name: 'greet',
  state: z.object({ greetings: z.array(z.string()) }),
  run: (context) => Promise.resolve({ kind: 'done', state: { greetings: context.input.names.map((name) => `Hello, ${name}!`) } }),
});

const count = definePhase<Input, { letters: number }>({
  name: 'count',
  state: z.object({ letters: z.number().int() }),
  needs: [greet],
  run: (context) => Promise.resolve({ kind: 'done', state: { letters: context.checkpoint(greet).greetings.join('').length } }),
});

const greetings = definePipeline<Input>({
  name: 'greetings',
  description: 'Greets everyone named, then counts the letters.',
  input,
  phases: [greet, count],
  publish: (context) => ({
    outcome: 'complete',
    title: 'Greetings',
    markdown: [...context.checkpoint(greet).greetings, `${context.checkpoint(count).letters} characters`].join('\n'),
    missing: [],
  }),
});

export const { submitJob, runJobStep, sweepJobs, cancelJob, decideJob, opsAction } = createPhaseline({ pipelines: [greetings] });
