/** The tool port: what an agent can call, and how a call is executed. */
import type { ToolCall, ToolSpec } from './provider';

export interface ToolResult {
  readonly content: string;
  /** False when the tool itself failed; the model sees the failure text and may try something else. */
  readonly ok: boolean;
}

export interface Toolbox {
  readonly specs: readonly ToolSpec[];
  execute(call: ToolCall, signal: AbortSignal): Promise<ToolResult>;
}
