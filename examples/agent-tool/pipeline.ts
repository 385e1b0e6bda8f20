/**
 * An agent pipeline with a custom tool and any AI SDK model: a store assistant that answers a
 * shopper's question, looking up opening hours with its own tool. The section it runs is durable:
 * its transcript is saved after every model answer and tool result, a failed attempt is retried
 * warm (same thread) or cold (clean thread), and an item that fails them all is reported, not lost.
 *
 * Register it beside your other pipelines, handing in the model you use:
 *   createPhaseline({ pipelines: [createStoreAssistant(openai('gpt-4o-mini'))] })
 */
import { z } from 'zod';
import { agentWait, createAiSdkProvider, createToolbox, definePhase, definePipeline, defineTool, runAgentSection, type AgentDeps, type AiSdkLanguageModel } from 'phaseline';

const HOURS: Readonly<Record<string, string>> = {
  lisbon: 'Mon-Sat 09:00-20:00, closed on Sunday',
  oslo: 'Mon-Fri 10:00-18:00, Sat 10:00-16:00, closed on Sunday',
};

/** A tool: a name, what it is for, its arguments' zod schema, and what it does. */
export const openingHours = defineTool({
  name: 'opening_hours',
  description: 'The opening hours of our store in a city',
  input: z.object({ city: z.string().min(2).max(80) }),
  execute: ({ city }) => HOURS[city.trim().toLowerCase()] ?? `We have no store in ${city}.`,
});

const input = z.strictObject({ question: z.string().trim().min(5).max(500) });
type Input = z.output<typeof input>;
const answerState = z.object({ text: z.string(), skipped: z.boolean() });

/** The pipeline, with the model handed in through the AI SDK adapter. */
export function createStoreAssistant(model: AiSdkLanguageModel) {
  const agent: AgentDeps = {
    provider: createAiSdkProvider({ model, timeoutMs: 60_000, contextWindowTokens: 128_000, inputUsdPer1kTokens: 0.00015, outputUsdPer1kTokens: 0.0006 }),
    toolbox: createToolbox([openingHours]),
  };

  const answer = definePhase<Input, z.infer<typeof answerState>>({
    name: 'answer',
    state: answerState,
    run: async (context) => {
      const outcome = await runAgentSection(context, agent, {
        sectionId: 'answer',
        promptId: 'answer',
        system: 'You are the assistant of a small chain of stores. Use the tools to check facts; answer briefly.',
        prompt: context.input.question,
        coldContext: '',
        maxToolRounds: 3,
      });
      if (outcome.kind === 'provider-wait') return agentWait(outcome);
      if (outcome.kind === 'out-of-time') return { kind: 'yield' };
      if (outcome.kind === 'skipped') return { kind: 'done', state: { text: `No answer: ${outcome.reason}`, skipped: true } };
      return { kind: 'done', state: { text: outcome.text, skipped: false } };
    },
  });

  return definePipeline<Input>({
    name: 'store-assistant',
    description: 'Answers a shopper with the help of an opening-hours tool.',
    input,
    phases: [answer],
    publish: (context) => {
      const { text, skipped } = context.checkpoint(answer);
      return { outcome: skipped ? 'partial' : 'complete', title: context.input.question, markdown: text, missing: skipped ? ['the answer'] : [] };
    },
  });
}
