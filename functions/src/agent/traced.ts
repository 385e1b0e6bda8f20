/**
 * Spans for the agent's calls, by wrapping the ports rather than the code that calls them: a model
 * provider whose every `chat` is a span (provider, tokens, cost, outcome), a toolbox whose every
 * `execute` is a span (tool, call ID, outcome). Attribute names follow OpenTelemetry's GenAI
 * conventions where they have one (`gen_ai.*`). The wrappers pass requests and results through
 * unchanged; with no tracer provider registered the spans are the API's no-op ones.
 */
import { SpanKind } from '@opentelemetry/api';
import { errorOutcome, OUTCOME_ATTRIBUTE, startChildSpan, withSpan } from '../telemetry/spans';
import type { ChatRequest, ChatResponse, ModelProvider, ToolCall } from './provider';
import type { ToolStep, Toolbox, ToolResult } from './tools';

export const MODEL_ATTRIBUTES = {
  operation: 'gen_ai.operation.name',
  provider: 'gen_ai.provider.name',
  inputTokens: 'gen_ai.usage.input_tokens',
  outputTokens: 'gen_ai.usage.output_tokens',
  finishReasons: 'gen_ai.response.finish_reasons',
  costUsd: 'phaseline.model.cost_usd',
  messages: 'phaseline.model.messages',
  toolCalls: 'phaseline.model.tool_calls',
  streaming: 'phaseline.model.streaming',
} as const;

export const TOOL_ATTRIBUTES = {
  operation: 'gen_ai.operation.name',
  name: 'gen_ai.tool.name',
  callId: 'gen_ai.tool.call.id',
  resultChars: 'phaseline.tool.result_chars',
  sources: 'phaseline.tool.sources',
} as const;

/** One model call as a span: `chat <provider>`. */
export function traceModelCall(provider: ModelProvider, request: ChatRequest, call: () => Promise<ChatResponse>): Promise<ChatResponse> {
  const span = startChildSpan(`chat ${provider.name}`, {
    kind: SpanKind.CLIENT,
    attributes: {
      [MODEL_ATTRIBUTES.operation]: 'chat',
      [MODEL_ATTRIBUTES.provider]: provider.name,
      [MODEL_ATTRIBUTES.messages]: request.messages.length,
      [MODEL_ATTRIBUTES.streaming]: request.onText !== undefined,
    },
  });
  return withSpan(span, call, {
    onResult: (recording, response) => {
      recording.setAttributes({
        [MODEL_ATTRIBUTES.inputTokens]: response.usage.inputTokens,
        [MODEL_ATTRIBUTES.outputTokens]: response.usage.outputTokens,
        [MODEL_ATTRIBUTES.costUsd]: response.costUsd,
        [MODEL_ATTRIBUTES.finishReasons]: [response.finishReason],
        [MODEL_ATTRIBUTES.toolCalls]: response.message.toolCalls?.length ?? 0,
      });
    },
    onError: (recording, error) => recording.setAttribute(OUTCOME_ATTRIBUTE, errorOutcome(error, request.signal)),
  });
}

/** One tool execution as a span: `execute_tool <name>`; a failure the model reads is outcome `tool-error`. */
export function traceToolCall(call: ToolCall, signal: AbortSignal, execute: () => Promise<ToolResult>): Promise<ToolResult> {
  const span = startChildSpan(`execute_tool ${call.name}`, {
    attributes: { [TOOL_ATTRIBUTES.operation]: 'execute_tool', [TOOL_ATTRIBUTES.name]: call.name, [TOOL_ATTRIBUTES.callId]: call.id },
  });
  return withSpan(span, execute, {
    onResult: (recording, result) => {
      recording.setAttributes({
        [OUTCOME_ATTRIBUTE]: result.ok ? 'ok' : 'tool-error',
        [TOOL_ATTRIBUTES.resultChars]: result.content.length,
        [TOOL_ATTRIBUTES.sources]: result.sources?.length ?? 0,
      });
    },
    onError: (recording, error) => recording.setAttribute(OUTCOME_ATTRIBUTE, errorOutcome(error, signal)),
  });
}

/** The provider with a span per call; name and context window are the provider's own. */
export function tracedProvider(provider: ModelProvider): ModelProvider {
  return {
    get name() {
      return provider.name;
    },
    get contextWindowTokens() {
      return provider.contextWindowTokens;
    },
    chat: (request) => traceModelCall(provider, request, () => provider.chat(request)),
  };
}

/** The toolbox with a span per execution; a toolbox bound to a job (`forJob`) or a step (`forStep`) is traced too. */
export function tracedToolbox(toolbox: Toolbox): Toolbox {
  const forJob = toolbox.forJob?.bind(toolbox);
  const forStep = toolbox.forStep?.bind(toolbox);
  const repeatable = toolbox.repeatable?.bind(toolbox);
  return {
    get specs() {
      return toolbox.specs;
    },
    execute: (call, signal, place) => traceToolCall(call, signal, () => toolbox.execute(call, signal, place)),
    ...(forJob ? { forJob: (jobId: string) => tracedToolbox(forJob(jobId)) } : {}),
    ...(forStep ? { forStep: (step: ToolStep) => tracedToolbox(forStep(step)) } : {}),
    ...(repeatable ? { repeatable } : {}),
  };
}
