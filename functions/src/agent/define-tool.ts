/**
 * Tools an agent-pipeline author writes: a name, a description, a zod schema for the arguments and
 * an `execute` function. `createToolbox` turns a list of them into the Toolbox the section runner
 * offers the model; arguments are parsed against the schema before `execute` sees them, and a bad
 * call comes back to the model as a tool error it can act on.
 *
 * A tool whose call changes something outside the job (files a ticket, sends a message, charges a
 * card) says so with `effect`. Its call then goes through the step's effect ledger
 * (core/effect-ledger.ts, effects/protocol.ts): the intent is recorded before `execute` runs, under
 * an idempotency key derived from the job, the unit and what the effect is, and `execute` is handed
 * that key. What the effect is: `effect.identity(input)` when the tool gives one, else the phase,
 * the section, the tool and the call's arguments with their keys sorted, never the call ID or the
 * thread. So the same call with the same arguments in a section is one effect whichever thread (a
 * warm retry, a clean one after a cold retry) or worker makes it, and two identical calls in one
 * section are one effect too unless `identity` tells them apart. A call whose key already holds an
 * effect recorded with other arguments is refused with a tool error the model reads: this call
 * applies nothing, and the recorded effect is first settled as its own call would settle it (an
 * unknown outcome looked up, an unsent one sent under its recorded arguments, a wait when its
 * target cannot answer), so the refusal can say what it did. A call whose result is on record is
 * never executed again; one whose outcome is unknown (a crash, a timeout) is looked up with
 * `effect.lookup` and recorded as applied when found, retried under the same key only when the
 * target says it has nothing, and otherwise waited on, never blindly re-sent.
 */
import { createHash } from 'node:crypto';
import type { z } from 'zod';
import { canonicalJson } from '../core/effect-keys';
import { EffectIntentConflictError, type EffectEntry, type EffectEvidence, type EffectIntent } from '../core/effect-ledger';
import type { ApplyOutcome, EffectAdapter, LookupOutcome } from '../effects/port';
import { settleEffect } from '../effects/protocol';
import type { Source, ToolCall, ToolSpec } from './provider';
import { toolArguments, toolError, toolParameters, ToolWaitError, type ToolCallPlace, type ToolResult, type ToolStep, type Toolbox } from './tools';

/** What `execute` may return: text for the model, or text with the sources it drew on (for citations). */
export type ToolOutput = string | { readonly content: string; readonly sources?: readonly Source[] };

/** What a tool's `execute` is given beside its parsed arguments. */
export interface ToolContext {
  /** The call being answered. */
  readonly call: ToolCall;
  /** Aborted when the step loses its claim: pass it to every request. */
  readonly signal: AbortSignal;
  /** The job and unit, when the toolbox runs inside a step (always, under runAgentSection). */
  readonly jobId: string | null;
  readonly unit: string | null;
}

/** What an effectful tool's `execute` is given: the context and the key the target must honour. */
export interface EffectContext extends ToolContext {
  /** The same for every attempt of this effect, by any worker; the target must apply a key at most once. */
  readonly idempotencyKey: string;
}

/** How a tool's external effect is recorded, looked up and named. */
export interface ToolEffect<TInput> {
  /**
   * Asks the system of record whether an effect with this key was applied: `found` (with its
   * evidence), `not-found` (a retry under the same key is safe), or `unreachable`.
   */
  lookup(idempotencyKey: string, signal: AbortSignal): Promise<LookupOutcome>;
  /** The target, for people (timeline, questions); defaults to the tool's name. */
  readonly target?: string;
  /**
   * What the effect is about, when that is a fact of the input ("the ticket for item 42"): every
   * call with the same identity in this job and unit is the same effect, from any section or thread.
   * A call whose arguments differ from those first recorded under its identity is refused with a
   * tool error naming the recorded call, never answered with that call's result as its own.
   *
   * Without it, the identity is the phase, the section, the tool and the arguments (keys sorted):
   * the same call in the same section is one effect across warm and cold retries and workers, and
   * two identical calls in one section are one effect (the second gets the first's result); the
   * same section ID in another phase is another section, with effects of its own. Give one when another
   * thread may word the same effect differently (a clean thread's model rephrasing a summary), or
   * when two identical calls must be two effects (put what tells them apart in the input).
   */
  identity?(input: TInput): string;
  /** How long one `execute` may take before it gives up (its own deadline); an entry found in flight is waited out this long. */
  readonly sendTimeoutMs?: number;
  /** How long to wait before trying again when the target is down or cannot tell (default 60 s). */
  readonly retryAfterMs?: number;
  /** The model's text for an applied effect (default: its evidence as JSON). */
  describe?(evidence: EffectEvidence): string;
}

/** A tool without an external effect: `execute` may run again after a crash (its recorded result is reused when there is one). */
export interface PlainToolDefinition<TInput> {
  /** Letters, digits, `_` and `-`, at most 64 (what every provider accepts). */
  readonly name: string;
  readonly description: string;
  /** The arguments' schema: offered to the model as JSON Schema, and parsed before `execute` runs. */
  readonly input: z.ZodType<TInput>;
  execute(input: TInput, context: ToolContext): Promise<ToolOutput> | ToolOutput;
  readonly effect?: undefined;
}

/** A tool whose call has an external effect: it runs through the step's effect ledger. */
export interface EffectToolDefinition<TInput> {
  readonly name: string;
  readonly description: string;
  readonly input: z.ZodType<TInput>;
  /** Applies the effect under `context.idempotencyKey` and says what happened (effects/port.ts ApplyOutcome). */
  execute(input: TInput, context: EffectContext): Promise<ApplyOutcome>;
  readonly effect: ToolEffect<TInput>;
}

/** A defined tool, ready for `createToolbox`. */
export type AgentTool = PlainToolDefinition<never> | EffectToolDefinition<never>;

const TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/;
/** The ledger's identity field holds at most this many characters; longer ones are hashed. */
const MAX_IDENTITY_CHARS = 300;
const DEFAULT_RETRY_AFTER_MS = 60_000;
/** Unusable answers one effect may get before one its target never received is given up on. */
const MAX_UNKNOWNS = 5;
/** Unknown-then-not-found rounds within one call before the step waits instead. */
const IMMEDIATE_RETRIES = 2;

// Two signatures, not one over the union: with the union, TypeScript cannot type `execute`'s parameters from the definition.
/**
 * Defines a tool. A bad definition (a name providers refuse, an empty description) throws at once.
 *
 * @example
 * const lookupOrder = defineTool({
 *   name: 'lookup_order',
 *   description: 'Finds an order by its number',
 *   input: z.object({ order: z.string() }),
 *   execute: async ({ order }) => JSON.stringify(await orders.find(order)),
 * });
 */
export function defineTool<TInput>(definition: PlainToolDefinition<TInput>): AgentTool;
// eslint-disable-next-line @typescript-eslint/unified-signatures
export function defineTool<TInput>(definition: EffectToolDefinition<TInput>): AgentTool;
export function defineTool<TInput>(definition: PlainToolDefinition<TInput> | EffectToolDefinition<TInput>): AgentTool {
  if (!TOOL_NAME.test(definition.name)) throw new Error(`Tool name ${JSON.stringify(definition.name)} must be 1 to 64 letters, digits, _ or -`);
  if (definition.description.trim() === '') throw new Error(`Tool ${definition.name} needs a description: the model chooses tools by it`);
  if (definition.effect !== undefined && typeof definition.effect.lookup !== 'function') {
    throw new Error(`Tool ${definition.name} has an effect but no lookup: an unknown outcome could not be reconciled`);
  }
  return definition as AgentTool;
}

/** A toolbox over defined tools; bind it to a step (runAgentSection does) before an effectful tool can run. */
export function createToolbox(tools: readonly AgentTool[]): Toolbox {
  const byName = new Map<string, AgentTool>();
  const kinds = new Map<string, string>();
  for (const tool of tools) {
    if (byName.has(tool.name)) throw new Error(`Two tools are named ${tool.name}`);
    byName.set(tool.name, tool);
    if (tool.effect === undefined) continue;
    const other = kinds.get(effectKind(tool.name));
    if (other !== undefined) throw new Error(`Tools ${other} and ${tool.name} would record their effects under one kind: rename one`);
    kinds.set(effectKind(tool.name), tool.name);
  }
  const specs: ToolSpec[] = tools.map((tool) => ({ name: tool.name, description: tool.description, parameters: toolParameters(tool.input) }));
  return new DefinedToolbox(byName, specs, null);
}

class DefinedToolbox implements Toolbox {
  constructor(
    private readonly tools: ReadonlyMap<string, AgentTool>,
    readonly specs: readonly ToolSpec[],
    private readonly step: ToolStep | null,
  ) {}

  forStep(step: ToolStep): Toolbox {
    return new DefinedToolbox(this.tools, this.specs, step);
  }

  repeatable(toolName: string): boolean {
    const tool = this.tools.get(toolName);
    return tool !== undefined && tool.effect === undefined;
  }

  async execute(call: ToolCall, signal: AbortSignal, place?: ToolCallPlace): Promise<ToolResult> {
    const tool = this.tools.get(call.name);
    if (tool === undefined) return toolError(`There is no tool named ${call.name}. Use one of: ${[...this.tools.keys()].join(', ')}.`);
    const parsed = toolArguments(tool.input as z.ZodType, call);
    if (!parsed.ok) return parsed.result;
    const context: ToolContext = { call, signal, jobId: this.step?.jobId ?? null, unit: this.step?.unit ?? null };
    if (tool.effect === undefined) {
      const output = await (tool as PlainToolDefinition<unknown>).execute(parsed.value, context);
      return typeof output === 'string' ? { ok: true, content: output } : { ok: true, content: output.content, ...(output.sources ? { sources: output.sources } : {}) };
    }
    return this.executeEffect(tool, parsed.value, context, place);
  }

  private async executeEffect(tool: EffectToolDefinition<unknown>, input: unknown, context: ToolContext, place: ToolCallPlace | undefined): Promise<ToolResult> {
    const step = this.step;
    if (step === null || place === undefined) {
      throw new Error(`Tool ${tool.name} has an external effect: it runs only inside a step, through runAgentSection (which records it in the effect ledger)`);
    }
    const effect = tool.effect;
    const intent = effectIntent(tool, input, context.call, step, place);
    // An entry recorded for this very call under the call-ID identity of revisions before the arguments keyed it: one document read more per call (callIdIdentity says when it can go).
    let planned: EffectEntry | undefined = effect.identity === undefined ? ((await step.effects.find(callIdIdentity(intent, context.call, place))) ?? undefined) : undefined;
    // True when the recorded effect under this call's key has other arguments: it is settled as its own call would settle it, then this call is refused.
    let refused = false;
    if (planned === undefined) {
      try {
        [planned] = await step.effects.plan([intent]);
      } catch (error) {
        if (!(error instanceof EffectIntentConflictError)) throw error;
        const recorded = error.conflicts[0]?.recorded;
        if (recorded === undefined || error.conflicts.length !== 1) throw error;
        refused = !sameCallRecordedEarlier(intent, recorded);
        planned = recorded;
      }
    }
    if (planned === undefined) throw new Error(`The effect ledger recorded nothing for ${tool.name}`);
    const target = effect.target ?? tool.name;
    const adapter: EffectAdapter = {
      name: target,
      ...(effect.sendTimeoutMs === undefined ? {} : { sendTimeoutMs: effect.sendTimeoutMs }),
      // The recorded intent is applied, never this call's arguments: a call meeting an entry recorded with other ones settles that entry, then is refused.
      apply: (recorded, idempotencyKey, signal) => tool.execute(recordedInput(tool, recorded), { ...context, signal, idempotencyKey }),
      lookup: (idempotencyKey, signal) => effect.lookup(idempotencyKey, signal),
    };
    const settled = await settleEffect(step.effects, adapter, planned, {
      signal: step.signal,
      clock: step.clock,
      maxUnknowns: MAX_UNKNOWNS,
      immediateRetries: IMMEDIATE_RETRIES,
      // No person is asked about a tool's effect: an outcome nobody can tell is looked up again later.
      answerFor: () => null,
      note: (kind, message) => step.note(kind, message),
    });
    const nowMs = step.clock.now();
    const retryAtMs = nowMs + (effect.retryAfterMs ?? DEFAULT_RETRY_AFTER_MS);
    // A refusal names the recorded effect once it is resolved; one still unknown, or not sent yet, is waited on below as for its own call.
    if (refused && (settled.kind === 'applied' || settled.kind === 'failed')) return conflictResult(tool, settled.entry);
    switch (settled.kind) {
      case 'applied': {
        const evidence = settled.entry.evidence ?? {};
        return { ok: true, content: effect.describe ? effect.describe(evidence) : JSON.stringify({ applied: true, ...evidence }) };
      }
      case 'failed':
        return toolError(`Not applied: ${settled.entry.lastOutcome ?? 'refused'}. Do not try this again unchanged.`);
      case 'unavailable':
        throw new ToolWaitError(
          `${tool.name}: ${target} is unavailable (${settled.reason}); the call runs again when the job resumes`,
          Math.max(retryAtMs, settled.retryAfterMs === null ? 0 : nowMs + settled.retryAfterMs),
        );
      case 'in-flight':
        throw new ToolWaitError(`${tool.name}: an earlier request to ${target} may still be on its way; it is checked at ${new Date(settled.untilMs).toISOString()}`, settled.untilMs);
      case 'cannot-tell':
        throw new ToolWaitError(`${tool.name}: outcome unknown and ${target} cannot be asked (${settled.reason}); it is looked up again when the job resumes`, retryAtMs);
      case 'stop':
        throw new Error(`${tool.name}: the effect was stopped (${settled.entry.resolution ?? 'no reason recorded'})`);
    }
  }
}

/**
 * The ledger intent of one effectful call: its identity names the effect, its payload holds the
 * arguments as recorded. Both use the arguments with their keys sorted, so the same call written in
 * another key order is the same effect with the same intent.
 */
function effectIntent(tool: EffectToolDefinition<unknown>, input: unknown, call: ToolCall, step: ToolStep, place: ToolCallPlace): EffectIntent {
  // Parsed as JSON already (toolArguments): this cannot throw.
  const raw: unknown = JSON.parse(call.arguments);
  // Not the call ID nor the thread's generation: a clean thread making the same call after a cold retry must meet the same key.
  // The phase: a section ID names a section only within its phase (the unit is part of every key already).
  const named = tool.effect.identity?.(input) ?? canonicalJson({ phase: step.phase, section: place.sectionId, tool: tool.name, arguments: raw });
  // An empty identity would make every such call one effect: refused, not guessed at.
  if (named.trim() === '') throw new Error(`Tool ${tool.name}: effect.identity gave an empty identity for ${call.id}`);
  return {
    kind: effectKind(tool.name),
    identity: boundedIdentity(named),
    target: tool.effect.target ?? tool.name,
    payload: { tool: tool.name, arguments: canonicalJson(raw) },
  };
}

/** An identity the ledger's field can hold: as it is when short enough, else its SHA-256. */
function boundedIdentity(named: string): string {
  return named.length <= MAX_IDENTITY_CHARS ? named : `sha256:${createHash('sha256').update(named).digest('hex')}`;
}

/**
 * The identity revisions before the arguments keyed an effect gave a tool without `identity`
 * (section, thread and call ID). An effect such a revision recorded for this very call (in flight
 * across the deploy: applied with its result not yet in the transcript, or unknown) is this call's
 * effect, and planning under the new identity would apply it again. Looking it up costs one document
 * read per effectful call of a tool without `identity`; the look-up can be removed once no job that
 * started before that change (4f0a48c) can still be in flight.
 */
function callIdIdentity(intent: EffectIntent, call: ToolCall, place: ToolCallPlace): Pick<EffectIntent, 'kind' | 'identity'> {
  return { kind: intent.kind, identity: boundedIdentity(`${place.sectionId}/g${place.generation}/${call.id}`) };
}

/**
 * True when the conflict is only the order of the arguments' keys: entries planned before arguments
 * were recorded sorted (an effect in flight across the deploy that sorted them) hash differently for
 * the same call, and are the same effect.
 */
function sameCallRecordedEarlier(intent: EffectIntent, recorded: EffectEntry): boolean {
  const before = recorded.intent;
  const argumentsText = before.payload.arguments;
  if (typeof argumentsText !== 'string' || before.kind !== intent.kind || before.identity !== intent.identity || before.target !== intent.target) return false;
  if (before.payload.tool !== intent.payload.tool) return false;
  let sorted: string;
  try {
    sorted = canonicalJson(JSON.parse(argumentsText));
  } catch {
    return false;
  }
  return sorted === intent.payload.arguments;
}

/**
 * What the model reads when its call names an effect already recorded with other arguments (a key
 * reused with other parameters), once that recorded effect is resolved: a refusal saying this call
 * applied nothing, and naming the recorded call, its state and what it did, so the recorded result
 * is not mistaken for this call's own.
 */
function conflictResult(tool: EffectToolDefinition<unknown>, recorded: EffectEntry): ToolResult {
  const text = recorded.intent.payload.arguments;
  const applied = recorded.state === 'applied';
  const result = applied ? (tool.effect.describe ? tool.effect.describe(recorded.evidence ?? {}) : (recorded.evidence ?? {})) : null;
  const outcome = recorded.lastOutcome ?? 'no reason recorded';
  return toolError(
    `Refused: this call applied nothing. Its effect (${recorded.intent.identity}) was already recorded by a ${tool.name} call with other arguments, and one effect is not applied twice with different parameters. ` +
      (applied ? `The recorded call was applied: ${typeof result === 'string' ? result : JSON.stringify(result)}. ` : `The recorded call was not applied (${outcome}). `) +
      'Do not repeat this call unchanged.',
    {
      recordedArguments: typeof text === 'string' ? (JSON.parse(text) as unknown) : null,
      recordedState: recorded.state,
      ...(applied ? { recordedResult: result } : { recordedOutcome: outcome }),
    },
  );
}

/** The ledger kind of a tool's effects: part of every key, so two tools never share one. */
function effectKind(toolName: string): string {
  return `tool-${toolName.toLowerCase().replace(/[^a-z0-9]+/g, '-')}`.slice(0, 40).replace(/-+$/, '');
}

/** The arguments of the call that first planned the effect, parsed again by the tool's schema. */
function recordedInput(tool: EffectToolDefinition<unknown>, recorded: EffectIntent): unknown {
  const text = recorded.payload.arguments;
  if (typeof text !== 'string') throw new Error(`The ledger entry of ${tool.name} holds no arguments`);
  return tool.input.parse(JSON.parse(text));
}
