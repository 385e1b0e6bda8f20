/** The tool port: what an agent can call, and how a call is executed. */
import type { ToolCall, ToolSpec } from './provider';

export interface ToolResult {
  readonly content: string;
  /** False when the tool itself failed; the model sees the failure text and may try something else. */
  readonly ok: boolean;
  /**
   * What a citation needs, for each source the result drew on (search hits, fetched pages), in a
   * form code can read without parsing `content`; `fetchedAt` is an ISO 8601 time.
   */
  readonly sources?: readonly {
    readonly url: string;
    readonly title: string;
    readonly passage: string;
    readonly fetchedAt: string;
    /** Where the full text was kept, when the result carries only part of it. */
    readonly artifact?: { readonly ref: string; readonly sha256: string; readonly size: number };
  }[];
}

export interface Toolbox {
  readonly specs: readonly ToolSpec[];
  execute(call: ToolCall, signal: AbortSignal): Promise<ToolResult>;
}
