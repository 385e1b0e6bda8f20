/** The tool port: what an agent can call, and how a call is executed. */
import { z } from 'zod';
import type { Clock } from '../core/clock';
import type { EffectLedger } from '../core/effect-ledger';
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

/**
 * Where in a job's work a tool call sits: the section and the thread (generation) that made it, in
 * the phase and unit of the step it runs in (ToolStep). Section IDs are unique only within a phase
 * and unit (sections and transcripts are keyed by all three), so a call's place is all of them.
 */
export interface ToolCallPlace {
  readonly sectionId: string;
  /** 0 for a section's first thread; each clean-thread (cold) reconstruction adds one. */
  readonly generation: number;
}

/**
 * What a toolbox bound to one step may use: the job and unit it serves, the step's owner-checked
 * effect ledger, its abort signal and clock. Tools with an external effect need it (agent/define-tool.ts).
 */
export interface ToolStep {
  readonly jobId: string;
  /** The phase the step runs: a section ID names a section only within its phase (and unit). */
  readonly phase: string;
  readonly unit: string | null;
  readonly effects: EffectLedger;
  readonly signal: AbortSignal;
  readonly clock: Clock;
  note(kind: string, message: string): void;
}

/** The tools a section may call: their specs for the model, and execute, which answers with a ToolResult rather than throwing. */
export interface Toolbox {
  readonly specs: readonly ToolSpec[];
  /** `place` is given by the section runner; a toolbox whose tools have no effects may ignore it. */
  execute(call: ToolCall, signal: AbortSignal, place?: ToolCallPlace): Promise<ToolResult>;
  /**
   * True when a call of this tool has no external effect and may simply run again after a crash:
   * the section then runs it while the answer that asked for it is still being saved. Absent or
   * false, the answer is on record before the call runs: after a crash the recorded call runs again
   * with its own arguments (its effect's key derives from them), not a new answer's.
   */
  repeatable?(toolName: string): boolean;
  /** For tools that keep something under the job they serve (fetch_page's artifacts): the toolbox bound to that job. */
  forJob?(jobId: string): Toolbox;
  /** For tools that need the step itself (effects through its ledger): the toolbox bound to that step. Preferred over `forJob`. */
  forStep?(step: ToolStep): Toolbox;
}

/**
 * Thrown by a tool whose call cannot be answered yet (the target of its effect is down, or the
 * effect's outcome is still unknown). Not the section's failure: no retry is spent, the call stays
 * open in the saved transcript, and the step waits until `untilMs`, when the call runs again.
 */
export class ToolWaitError extends Error {
  constructor(
    message: string,
    readonly untilMs: number,
  ) {
    super(message);
    this.name = 'ToolWaitError';
  }
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
