/**
 * The AI SDK's own mock model (MockLanguageModelV3 from `ai/test`), scripted turn by turn from what
 * it is asked, and handed to the engine through the AI SDK adapter (createAiSdkProvider) as any
 * real LanguageModel would be. Deciding from the prompt (not from a call counter) keeps a script
 * right across retries and resumed threads: the same thread gets the same answer.
 */
import type { LanguageModelV3CallOptions, LanguageModelV3Prompt, LanguageModelV3StreamPart } from '@ai-sdk/provider';
import { simulateReadableStream } from 'ai';
import { MockLanguageModelV3 } from 'ai/test';
import type { ModelProvider } from '../../functions/src/agent';
import { createAiSdkProvider } from '../../functions/src/providers/ai-sdk';

/** One answer of the scripted model. */
export type ScriptedTurn =
  | { readonly text: string }
  | { readonly toolCalls: readonly { readonly id: string; readonly name: string; readonly input: unknown }[] }
  /** An answer cut off at the output limit (finish reason `length`): a failed attempt for the section runner. */
  | { readonly cutOff: string }
  /** The request fails before any answer, with this error. */
  | { readonly fail: Error };

/** A tool result the model was shown, by tool name, with its text. */
export interface ShownResult {
  readonly toolName: string;
  readonly text: string;
}

/** The tool results in a prompt, in order. */
export function shownResults(prompt: LanguageModelV3Prompt): ShownResult[] {
  return prompt.flatMap((message) =>
    message.role === 'tool'
      ? message.content.flatMap((part) => (part.type === 'tool-result' ? [{ toolName: part.toolName, text: part.output.type === 'text' ? part.output.value : JSON.stringify(part.output) }] : []))
      : [],
  );
}

/** The text of a prompt's user messages, joined. */
export function userText(prompt: LanguageModelV3Prompt): string {
  return prompt
    .flatMap((message) => (message.role === 'user' ? message.content.flatMap((part) => (part.type === 'text' ? [part.text] : [])) : []))
    .join('\n');
}

const usage = { inputTokens: { total: 400, noCache: 400, cacheRead: undefined, cacheWrite: undefined }, outputTokens: { total: 40, text: 40, reasoning: undefined } };

function partsOf(turn: Exclude<ScriptedTurn, { fail: Error }>): LanguageModelV3StreamPart[] {
  const start: LanguageModelV3StreamPart = { type: 'stream-start', warnings: [] };
  if ('toolCalls' in turn) {
    return [
      start,
      ...turn.toolCalls.map((call): LanguageModelV3StreamPart => ({ type: 'tool-call', toolCallId: call.id, toolName: call.name, input: JSON.stringify(call.input) })),
      { type: 'finish', finishReason: { unified: 'tool-calls', raw: 'tool_calls' }, usage },
    ];
  }
  const text = 'text' in turn ? turn.text : turn.cutOff;
  return [
    start,
    { type: 'text-start', id: 't0' },
    { type: 'text-delta', id: 't0', delta: text },
    { type: 'text-end', id: 't0' },
    { type: 'finish', finishReason: 'text' in turn ? { unified: 'stop', raw: 'stop' } : { unified: 'length', raw: 'length' }, usage },
  ];
}

/** A MockLanguageModelV3 that answers each request with `decide(prompt)`; `doStreamCalls` records every request. */
export function scriptedModel(decide: (prompt: LanguageModelV3Prompt, options: LanguageModelV3CallOptions) => ScriptedTurn): MockLanguageModelV3 {
  return new MockLanguageModelV3({
    doStream: (options: LanguageModelV3CallOptions) => {
      const turn = decide(options.prompt, options);
      if ('fail' in turn) return Promise.reject(turn.fail);
      return Promise.resolve({ stream: simulateReadableStream({ chunks: partsOf(turn), initialDelayInMs: null, chunkDelayInMs: null }) });
    },
  });
}

/** The settings every scripted provider runs with: a price, so cost and waste are counted. */
export const SCRIPTED_MODEL_SETTINGS = { timeoutMs: 30_000, contextWindowTokens: 100_000, inputUsdPer1kTokens: 0.5, outputUsdPer1kTokens: 2 } as const;

/** The scripted model as the engine sees it: through the AI SDK adapter. */
export function scriptedProvider(model: MockLanguageModelV3): ModelProvider {
  return createAiSdkProvider({ model, ...SCRIPTED_MODEL_SETTINGS });
}
