/** The tool port: what an agent can call, and how a call is executed. */
import { z } from 'zod';
import type { ToolCall, ToolSpec } from './provider';

/** What a tool call returns to the model: its content, whether the tool worked, and the sources it drew on. */
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

/** The tools a section may call: their specs for the model, and execute, which answers with a ToolResult rather than throwing. */
export interface Toolbox {
  readonly specs: readonly ToolSpec[];
  execute(call: ToolCall, signal: AbortSignal): Promise<ToolResult>;
  /** For tools that keep something under the job they serve (fetch_page's artifacts): the toolbox bound to that job. */
  forJob?(jobId: string): Toolbox;
}

/** A tool's parameters as the JSON Schema a provider is offered (without the `$schema` key providers reject). */
export function toolParameters(schema: z.ZodType): Record<string, unknown> {
  const { $schema: _ignored, ...rest } = z.toJSONSchema(schema) as Record<string, unknown>;
  return rest;
}

/** A tool failure the model reads and can act on (never thrown). */
export function toolError(message: string, details: Record<string, unknown> = {}): ToolResult {
  return { ok: false, content: JSON.stringify({ error: message, ...details }) };
}

/** A call's arguments parsed against the tool's schema, or the failure the model reads. */
export function toolArguments<T>(schema: z.ZodType<T>, call: ToolCall): { ok: true; value: T } | { ok: false; result: ToolResult } {
  let raw: unknown;
  try {
    raw = JSON.parse(call.arguments);
  } catch {
    return { ok: false, result: toolError(`Arguments for ${call.name} are not valid JSON.`) };
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    return { ok: false, result: toolError(`Invalid arguments for ${call.name}: ${z.prettifyError(parsed.error).replace(/\s*\n\s*/g, '; ')}`) };
  }
  return { ok: true, value: parsed.data };
}
