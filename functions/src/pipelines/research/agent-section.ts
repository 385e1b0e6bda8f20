/**
 * Runs one agent section inside a step: transcripts persisted under the job (owner-checked), cost
 * flushed live, and the shared provider circuit consulted before and informed after.
 */
import { z } from 'zod';
import type { ProviderCircuit } from '../../agent/circuit';
import { isProviderOutage, type ModelProvider } from '../../agent/provider';
import { runSection, type SectionOutcome, type SectionPolicy, type SectionSpec, type StoredTranscript, type UsageEntry } from '../../agent/section-runner';
import type { Toolbox } from '../../agent/tools';
import { describeError } from '../../core/errors';
import type { Timers } from '../../core/flusher';
import type { StepContext } from '../../core/pipeline';

export interface ResearchDeps {
  readonly provider: ModelProvider;
  readonly toolbox: Toolbox;
  readonly circuit: ProviderCircuit;
  readonly policy?: Partial<SectionPolicy>;
  readonly timers?: Timers;
}

/** The provider is down for everyone: the step should wait (visibly) until the circuit lets probes through. */
export interface ProviderWait {
  readonly kind: 'provider-wait';
  readonly untilMs: number;
  readonly question: string;
}

const toolCall = z.object({ id: z.string(), name: z.string(), arguments: z.string() });
const chatMessage = z.discriminatedUnion('role', [
  z.object({ role: z.literal('system'), content: z.string() }),
  z.object({ role: z.literal('user'), content: z.string(), promptId: z.string().optional() }),
  z.object({ role: z.literal('assistant'), content: z.string().nullable(), toolCalls: z.array(toolCall).optional() }),
  z.object({ role: z.literal('tool'), toolCallId: z.string(), name: z.string(), content: z.string() }),
]);
const tallySchema = z.object({
  modelCalls: z.number(),
  toolCalls: z.number(),
  inputTokens: z.number(),
  outputTokens: z.number(),
  usd: z.number(),
  wastedModelCalls: z.number(),
  wastedToolCalls: z.number(),
  wastedInputTokens: z.number(),
  wastedOutputTokens: z.number(),
  wastedUsd: z.number(),
});
const storedTranscriptSchema = z.object({
  generation: z.number().int().nonnegative(),
  messages: z.array(chatMessage),
  attempts: z.object({ warm: z.number().int().nonnegative(), cold: z.number().int().nonnegative() }),
  tally: tallySchema,
});

/** Firestore drops `undefined`; the transcript is stored without optional fields that are unset. */
function storable(transcript: StoredTranscript): unknown {
  return JSON.parse(JSON.stringify(transcript)) as unknown;
}

function costIncrements(entry: UsageEntry): Record<string, number> {
  const delta = entry.delta;
  return {
    modelCalls: delta.modelCalls,
    toolCalls: delta.toolCalls,
    inputTokens: delta.inputTokens,
    outputTokens: delta.outputTokens,
    spentUsd: delta.usd,
    wastedModelCalls: delta.wastedModelCalls,
    wastedToolCalls: delta.wastedToolCalls,
    wastedUsd: delta.wastedUsd,
  };
}

export async function runAgentSection<TInput>(
  context: StepContext<TInput>,
  deps: ResearchDeps,
  spec: SectionSpec,
): Promise<SectionOutcome | ProviderWait> {
  const nowMs = context.clock.now();
  const circuit = await deps.circuit.check(nowMs);
  if (circuit.open && circuit.untilMs !== null) {
    return { kind: 'provider-wait', untilMs: circuit.untilMs, question: `Provider ${deps.provider.name} unavailable; resuming automatically` };
  }
  try {
    const outcome = await runSection(spec, {
      provider: deps.provider,
      toolbox: deps.toolbox,
      signal: context.signal,
      random: context.random,
      ...(deps.policy ? { policy: deps.policy } : {}),
      ...(deps.timers ? { timers: deps.timers } : {}),
      transcripts: {
        load: async (sectionId) => {
          const stored = await context.loadTranscript(sectionId);
          if (stored === null) return null;
          const parsed = storedTranscriptSchema.safeParse(stored);
          if (parsed.success) return parsed.data as StoredTranscript;
          // Refused, not trusted: the section starts a clean thread.
          context.note('transcript-refused', `${spec.sectionId}: stored transcript failed validation; starting a clean thread`);
          return null;
        },
        save: (sectionId, transcript) => context.saveTranscript(sectionId, storable(transcript)),
      },
      onUsage: (entry) => context.addCost(costIncrements(entry)),
    });
    await deps.circuit.recordSuccess(context.clock.now());
    return outcome;
  } catch (error) {
    if (!isProviderOutage(error) || context.signal.aborted) throw error;
    const state = await deps.circuit.recordOutage(context.clock.now(), describeError(error));
    if (state.open && state.untilMs !== null) {
      return { kind: 'provider-wait', untilMs: state.untilMs, question: `Provider ${deps.provider.name} unavailable (${describeError(error)}); resuming automatically` };
    }
    throw error;
  }
}
