/**
 * Runs one section (one bounded unit of agent output) with recovery.
 *
 * - Every model answer and every tool result is saved as soon as it exists, and everything before a
 *   tool call that may have an effect is on record before that call runs; a call the toolbox calls
 *   repeatable (no external effect) runs while the saves before it are still in flight. A recorded
 *   result is never lost or re-executed; a crash re-runs only repeatable calls whose results had not
 *   landed yet. Saves are made one after another in the order asked, and one still waiting for its
 *   turn when a newer one is asked for is left to the newer (it holds all of it): one commit, not
 *   two. The save of a group's last result overlaps the
 *   next model call and is on record before that call's answer is used; the final answer's save is
 *   handed to a port that can make it behind the work (`saveBehind`: the step keeps it on record
 *   before anything after it), else waited for. A crash before a save lands re-runs only calls whose
 *   results were never recorded. The spend check before a call is read ahead, beside the saves and
 *   tool calls before it (docs/agent-toolkit.md lists what overlaps what).
 * - A stored transcript found at start is a crash: it is repaired and the same thread continues
 *   (no prompt re-sent, no recorded tool call repeated). When the worker died between the tool
 *   calls of one model turn, the results it saved are kept and only the calls without a result run
 *   before the next model call. If it cannot be shown sound, the section starts a clean generation.
 * - Transient provider trouble is retried inside the call (full jitter, honouring retry-after) and,
 *   if it persists, thrown out: an outage is not the section's fault and spends none of its attempts.
 * - Every model call, retry and wait fits in the step's remaining time: a call is given at most what
 *   is left, none starts without `minCallTimeMs` left, and no wait runs past the deadline. A section
 *   that cannot finish in time ends `out-of-time` (its transcript is durable; the next step goes on)
 *   instead of running until the platform kills the worker.
 * - A tool that cannot answer yet (ToolWaitError: an effect whose target is down or whose outcome
 *   is unknown) is thrown out as it is: its call stays open in the saved transcript, no attempt is
 *   spent, and the next step runs that call again.
 * - Other failures spend attempts: warm retries first (repair, compact if the context overflowed,
 *   continue the same thread), then cold retries (a new generation from the prompt and the rolling
 *   context), then an explicit `skipped` outcome naming the last error.
 * - Every model and tool call is counted as spent; calls whose output is thrown away are also
 *   counted as wasted.
 * - The sources each tool result drew on are recorded with it, numbered for citing (transcript.ts
 *   says how), so they live and die with the messages: a warm retry keeps them, a clean thread
 *   drops them. They are never sent to the provider; a written section returns its thread's sources.
 *
 * Pure core: no Firebase imports. Persistence is the TranscriptPort's job.
 */
import type { RandomSource } from '../core/clock';
import { describeError, PhaselineError } from '../core/errors';
import { realTimers, type Timers } from '../core/flusher';
import { anyKeepingChecks } from '../core/lease-guard';
import type { SpendMeter } from '../core/pipeline';
import {
  ContextWindowError,
  isProviderOutage,
  MalformedResponseError,
  ProviderTimeoutError,
  type BilledCall,
  type ChatMessage,
  type ChatResponse,
  type ModelProvider,
  type NumberedSource,
  type Source,
  type ToolCall,
} from './provider';
import { toolError, ToolWaitError, type ToolResult, type Toolbox } from './tools';
import {
  citationKey,
  compactTranscript,
  estimateTokens,
  findResumeProblems,
  numberSources,
  openToolCalls,
  repairForWarmRetry,
  threadSources,
  toolRoundsSincePrompt,
  withoutSources,
} from './transcript';

/** Model calls, tool calls, tokens and money a section used, across its attempts. */
export interface CostTally {
  readonly modelCalls: number;
  readonly toolCalls: number;
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly usd: number;
  /** The part of the above whose output was thrown away (also counted in the totals). */
  readonly wastedModelCalls: number;
  readonly wastedToolCalls: number;
  readonly wastedInputTokens: number;
  readonly wastedOutputTokens: number;
  readonly wastedUsd: number;
}

/** A tally with nothing counted yet: where a section's cost starts. */
export const EMPTY_TALLY: CostTally = {
  modelCalls: 0,
  toolCalls: 0,
  inputTokens: 0,
  outputTokens: 0,
  usd: 0,
  wastedModelCalls: 0,
  wastedToolCalls: 0,
  wastedInputTokens: 0,
  wastedOutputTokens: 0,
  wastedUsd: 0,
};

export function addTallies(a: CostTally, b: Partial<CostTally>): CostTally {
  return {
    modelCalls: a.modelCalls + (b.modelCalls ?? 0),
    toolCalls: a.toolCalls + (b.toolCalls ?? 0),
    inputTokens: a.inputTokens + (b.inputTokens ?? 0),
    outputTokens: a.outputTokens + (b.outputTokens ?? 0),
    usd: a.usd + (b.usd ?? 0),
    wastedModelCalls: a.wastedModelCalls + (b.wastedModelCalls ?? 0),
    wastedToolCalls: a.wastedToolCalls + (b.wastedToolCalls ?? 0),
    wastedInputTokens: a.wastedInputTokens + (b.wastedInputTokens ?? 0),
    wastedOutputTokens: a.wastedOutputTokens + (b.wastedOutputTokens ?? 0),
    wastedUsd: a.wastedUsd + (b.wastedUsd ?? 0),
  };
}

/** The section's transcript as the engine persists it (owner-checked) under the job. */
export interface StoredTranscript {
  /** 0 for the first thread; each clean-thread (cold) reconstruction adds one. */
  readonly generation: number;
  readonly messages: readonly ChatMessage[];
  /** Warm and cold retries spent so far; they survive crashes, so a crash loop cannot reset them. */
  readonly attempts: { readonly warm: number; readonly cold: number };
  /** Cumulative cost of the section across every attempt and every worker that ran it. */
  readonly tally: CostTally;
}

/** Where a section's transcript is kept between steps (a StepContext's loadTranscript / saveTranscript), so a reclaimed worker warm-resumes it. */
export interface TranscriptPort {
  load(sectionId: string): Promise<StoredTranscript | null>;
  /** Must resolve only once the transcript is durable; a rejection stops the section and is thrown as is. */
  save(sectionId: string, transcript: StoredTranscript): Promise<void>;
  /**
   * Takes a save to make behind the work, for the final answer's: the section returns at once, and
   * the port keeps the save on record before anything that comes after it (the step's next write,
   * its end) and fails the step if it cannot be made. Without it, the final answer's save is waited for.
   */
  saveBehind?(sectionId: string, transcript: StoredTranscript): void;
}

/** One section to write: its ID, prompt, system text, the context for a cold rebuild and the tool-round budget of an attempt. */
export interface SectionSpec {
  readonly sectionId: string;
  /** Marks the section's exact prompt message; warm repair keeps everything up to the latest one. */
  readonly promptId: string;
  readonly system: string;
  readonly prompt: string;
  /** Rolling summary of completed work, used to rebuild a clean thread on a cold retry. */
  readonly coldContext: string;
  /** Model turns with tool calls one attempt may take before it counts as failed. */
  readonly maxToolRounds: number;
  /** Sources the prompt itself shows (for example notes written earlier): numbered first, listed after the prompt. */
  readonly sources?: readonly Source[];
}

/** How a failed section attempt is retried: same-thread (warm) retries first, then clean-thread (cold) ones, within call and tool limits. */
export interface SectionPolicy {
  /** Same-thread retries after a failed attempt. */
  readonly warmRetries: number;
  /** Clean-thread (new generation) retries once warm retries are spent or impossible. */
  readonly coldRetries: number;
  /** In-call retries of one model call on rate limits, outages and timeouts. */
  readonly transientRetries: number;
  /** Backoff base: the first retry waits up to this long (full jitter), doubling per retry. */
  readonly transientMinDelayMs: number;
  /**
   * Backoff ceiling. A provider retry-after longer than this is not waited out in-process: the
   * error is thrown so the engine can requeue the job for later.
   */
  readonly transientMaxDelayMs: number;
  /** On a context-window failure, compact to at most this share of the provider's window. */
  readonly compactToWindowShare: number;
  /** The longest one model call may take; the step's remaining time may cut it shorter. */
  readonly callTimeoutMs: number;
  /** No model call starts with less than this left in the step: the section yields instead. */
  readonly minCallTimeMs: number;
  /**
   * Tool calls one model answer may have run; the ones after them get a tool error result without
   * running. Rounds alone do not bound the work: one answer can ask for any number of calls.
   */
  readonly maxToolCallsPerAnswer: number;
}

/** The section runner's retry and limit defaults; resolveSectionPolicy applies overrides to them. */
export const DEFAULT_SECTION_POLICY: SectionPolicy = {
  warmRetries: 2,
  coldRetries: 2,
  transientRetries: 3,
  transientMinDelayMs: 1_000,
  transientMaxDelayMs: 20_000,
  compactToWindowShare: 0.5,
  callTimeoutMs: 120_000,
  minCallTimeMs: 10_000,
  maxToolCallsPerAnswer: 8,
};

/** The default section policy with `overrides` applied, checked: retry counts whole and non-negative, delays and timeouts ordered. */
export function resolveSectionPolicy(overrides: Partial<SectionPolicy> = {}): SectionPolicy {
  const policy = { ...DEFAULT_SECTION_POLICY, ...overrides };
  for (const name of ['warmRetries', 'coldRetries', 'transientRetries'] as const) {
    if (!Number.isInteger(policy[name]) || policy[name] < 0) throw new Error(`Section policy ${name} must be a non-negative integer, got ${policy[name]}`);
  }
  if (!Number.isInteger(policy.maxToolCallsPerAnswer) || policy.maxToolCallsPerAnswer < 1) {
    throw new Error(`Section policy maxToolCallsPerAnswer must be a positive integer, got ${policy.maxToolCallsPerAnswer}`);
  }
  if (!(policy.transientMinDelayMs >= 0) || !(policy.transientMaxDelayMs >= policy.transientMinDelayMs)) {
    throw new Error(
      `Section policy needs 0 <= transientMinDelayMs (${policy.transientMinDelayMs}) <= transientMaxDelayMs (${policy.transientMaxDelayMs})`,
    );
  }
  if (!(policy.minCallTimeMs > 0) || !(policy.callTimeoutMs >= policy.minCallTimeMs) || !Number.isFinite(policy.callTimeoutMs)) {
    throw new Error(`Section policy needs 0 < minCallTimeMs (${policy.minCallTimeMs}) <= callTimeoutMs (${policy.callTimeoutMs}), both finite`);
  }
  if (!(policy.compactToWindowShare > 0 && policy.compactToWindowShare <= 1)) {
    throw new Error(`Section policy compactToWindowShare must be in (0, 1], got ${policy.compactToWindowShare}`);
  }
  return policy;
}

/** One cost event, reported as it happens; `delta` is what to add to the running cost. */
export interface UsageEntry {
  readonly sectionId: string;
  readonly generation: number;
  readonly kind: 'model_call' | 'tool_call' | 'wasted';
  readonly delta: CostTally;
  /** Provider or tool name, or why output was thrown away. */
  readonly detail: string;
}

/** What runSection works with: the model provider, the toolbox, the transcript port, the claim signal, and optionally its policy, time left, spend meter and usage and draft callbacks. */
export interface SectionDeps {
  readonly provider: ModelProvider;
  readonly toolbox: Toolbox;
  readonly transcripts: TranscriptPort;
  readonly signal: AbortSignal;
  readonly policy?: Partial<SectionPolicy>;
  readonly random?: RandomSource;
  /** Timers for backoff waits; real ones by default. */
  readonly timers?: Timers;
  /**
   * Milliseconds left before the step's hard deadline (the step context's `remainingMs`). Every
   * model call and wait is bounded by it; without it only `callTimeoutMs` bounds a call.
   */
  readonly remainingMs?: () => number;
  /** Called for every model call, tool call and discard as it happens, so cost can be flushed live. */
  readonly onUsage?: (entry: UsageEntry) => void;
  /** Given the text of the answer being written, as it grows (the provider streams); absent, nothing streams. */
  readonly onDraft?: (text: string) => void;
  /**
   * The owner's spend cap: asked before every model call (its refusal is thrown out of the
   * section, which stops at the call's boundary with its transcript saved), charged after every
   * call that reported a cost, its answer used or not.
   */
  readonly spend?: SpendMeter;
}

/** The retries a section used (warm, cold) and the thread it ended on (generation: 0 for the first, one more per clean thread). */
export interface SectionAttempts {
  readonly warm: number;
  readonly cold: number;
  readonly generation: number;
}

/** How a section ended: written (text, numbered sources, cost), skipped once its retries were spent, or out of the step's time. */
export type SectionOutcome =
  | {
      readonly kind: 'written';
      /** May cite `[n]`, where n is the `number` of one of `sources`. */
      readonly text: string;
      /** Every source the final thread showed the model, one per URL, by number. */
      readonly sources: readonly NumberedSource[];
      readonly tally: CostTally;
      readonly attempts: SectionAttempts;
    }
  | { readonly kind: 'skipped'; readonly reason: string; readonly tally: CostTally; readonly attempts: SectionAttempts }
  /** The step's time ran out first. The transcript is saved: run the section again in a new step and it goes on. */
  | { readonly kind: 'out-of-time'; readonly reason: string; readonly tally: CostTally; readonly attempts: SectionAttempts };

/** An attempt failed for a reason of its own (not the provider's health): spend a warm or cold retry. */
export class SectionAttemptError extends Error {
  constructor(message: string, options: { readonly cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'SectionAttemptError';
  }
}

/** The step has no time left for the next model call (or the call was cut at the step's deadline). */
class OutOfTimeError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'OutOfTimeError';
  }
}

/** Failures that spend one of the section's attempts; everything else is thrown out of runSection. */
export function isAttemptFailure(error: unknown): boolean {
  return error instanceof SectionAttemptError || error instanceof ContextWindowError || error instanceof MalformedResponseError;
}

/** Never compact to more than this share of what the transcript was estimated at when the provider refused it. */
const MAX_SHARE_AFTER_COMPACTION = 0.75;

/** Writes one section with tool calls, checkpointing the transcript after every recorded tool result, so no recorded call is repeated and no transcript with unresolved calls is continued. */
export async function runSection(spec: SectionSpec, deps: SectionDeps): Promise<SectionOutcome> {
  return new SectionRun(spec, deps).run();
}

interface CallCost {
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly usd: number;
}

class SectionRun {
  private readonly policy: SectionPolicy;
  private readonly random: RandomSource;
  private readonly timers: Timers;
  private readonly signal: AbortSignal;
  private generation = 0;
  private messages: ChatMessage[] = [];
  private attempts = { warm: 0, cold: 0 };
  private tally: CostTally = EMPTY_TALLY;
  /** A tool result's save still in flight (see saveInBackground). */
  private pendingSave: Promise<void> | null = null;
  /** Saves asked for so far (the final answer's included): a save that is no longer the newest when its turn comes writes nothing. */
  private savesAsked = 0;
  /** The first background save that failed, known as soon as it fails: nothing more is started after it. */
  private saveFailed: { readonly error: unknown } | null = null;
  /** What each model answer made in this process cost, so discarding it can count the waste exactly. */
  private readonly costs = new WeakMap<ChatMessage, CallCost>();

  constructor(
    private readonly spec: SectionSpec,
    private readonly deps: SectionDeps,
  ) {
    this.policy = resolveSectionPolicy(deps.policy);
    this.random = deps.random ?? Math.random;
    this.timers = deps.timers ?? realTimers;
    this.signal = deps.signal;
  }

  async run(): Promise<SectionOutcome> {
    let outcome: SectionOutcome;
    try {
      outcome = await this.runThread();
    } catch (error) {
      // The error that ended the section is the one to report; a save still in flight is let finish first.
      await this.settleSave().catch(() => undefined);
      throw error;
    }
    await this.settleSave();
    return outcome;
  }

  private async runThread(): Promise<SectionOutcome> {
    this.signal.throwIfAborted();
    // A model call follows (unless the stored transcript holds the answer): its spend check is read beside the transcript.
    this.deps.spend?.readAhead?.();
    const stored = await this.deps.transcripts.load(this.spec.sectionId);
    if (stored === null) {
      // Not saved yet: a first thread is the prompt alone, made again the same way if this worker dies before the first answer.
      this.messages = this.freshThread();
    } else {
      const done = await this.resume(stored);
      if (done !== null) return done;
    }

    for (;;) {
      let failure: unknown;
      try {
        const text = await this.attempt();
        return this.written(text);
      } catch (error) {
        this.signal.throwIfAborted();
        if (error instanceof OutOfTimeError) return { kind: 'out-of-time', reason: error.message, tally: this.tally, attempts: this.outcomeAttempts() };
        if (!isAttemptFailure(error)) throw error;
        failure = error;
      }
      const skipped = await this.recover(failure);
      if (skipped !== null) return skipped;
    }
  }

  /** Picks up a transcript a previous worker left behind. Resolves to an outcome only when it already held the answer. */
  private async resume(stored: StoredTranscript): Promise<SectionOutcome | null> {
    this.generation = stored.generation;
    this.attempts = { warm: stored.attempts.warm, cold: stored.attempts.cold };
    this.tally = stored.tally;
    this.messages = [...stored.messages];

    const recorded = recordedAnswer(stored.messages, this.spec.promptId);
    if (recorded !== null) return this.written(recorded);

    const repaired = repairForWarmRetry(stored.messages, this.spec.promptId);
    if (repaired.sound) {
      this.waste(repaired.dropped, 'calls cut off by a crash');
      this.messages = repaired.messages;
      await this.save();
      return null;
    }
    // A crash is not the section's failure (the engine counts stale reclaims): a new generation, no cold retry spent.
    await this.startColdThread(`stored transcript not sound: ${repaired.reason}`, false);
    return null;
  }

  /** One attempt: continue the current thread until the model answers without tool calls. */
  private async attempt(): Promise<string> {
    let rounds = toolRoundsSincePrompt(this.messages, this.spec.promptId);
    for (;;) {
      // The thread may end in a group a crash or a failed tool cut short: finish it before asking the model.
      await this.runOpenCalls();
      this.signal.throwIfAborted();
      const response = await this.callModel();
      const message = response.message;
      const calls = message.toolCalls ?? [];
      const cost: CallCost = { inputTokens: response.usage.inputTokens, outputTokens: response.usage.outputTokens, usd: response.costUsd };

      if (response.finishReason === 'length') {
        this.wasteCall(cost, 'answer cut off at the output limit');
        throw new SectionAttemptError('the model answer was cut off at the output limit');
      }
      if (calls.length === 0) {
        const text = message.content ?? '';
        if (text.trim() === '') {
          this.wasteCall(cost, 'empty answer');
          throw new SectionAttemptError('the model gave an empty answer');
        }
        this.append(message, cost);
        await this.saveAnswer();
        return text;
      }

      const badId = this.unusableCallId(message);
      if (badId !== null) {
        this.wasteCall(cost, 'unusable tool call IDs');
        throw new MalformedResponseError(`the model answer has an unusable tool call ID (${badId})`);
      }
      rounds += 1;
      if (rounds > this.spec.maxToolRounds) {
        this.wasteCall(cost, 'tool round limit');
        throw new SectionAttemptError(`the model asked for more than ${this.spec.maxToolRounds} tool rounds`);
      }

      // Saved at once; runOpenCalls waits for it before any call that may have an effect, so a crash from here on leaves a repairable transcript.
      this.append(message, cost);
      this.saveInBackground();
      // The next model call comes after these tool calls: its spend check is read now, beside their saves and runs.
      this.deps.spend?.readAhead?.();
    }
  }

  /**
   * Runs the calls of the thread's last group that have no recorded result, saving each result as
   * it comes, on record before the next call that may have an effect starts: a result on record is
   * never produced again. Calls past the
   * policy's bound for one answer are answered with a tool error instead, after the allowed ones
   * and without running (also when a resumed group still has them open), so every call has its
   * result and the model reads why.
   */
  private async runOpenCalls(): Promise<void> {
    const asked = trailingAnswerCalls(this.messages);
    const allowed = new Set(asked.slice(0, this.policy.maxToolCallsPerAnswer).map((call) => call.id));
    const open = openToolCalls(this.messages);
    for (const call of open.filter((entry) => allowed.has(entry.id))) {
      // A call that may have an effect runs only once the answer that asked for it and every result before it are on record; one that can just run again after a crash runs beside their saves.
      if (!this.repeatable(call)) await this.settleSave();
      await this.stopIfSaveFailed();
      this.signal.throwIfAborted();
      let result: ToolResult;
      try {
        result = await this.deps.toolbox.execute(call, this.signal, { sectionId: this.spec.sectionId, generation: this.generation });
      } catch (error) {
        this.signal.throwIfAborted();
        // The call cannot be answered yet (its effect's target is down, or its outcome unknown): the section waits, it did not fail.
        if (error instanceof ToolWaitError) {
          // A wait leaves the call open in the saved transcript: the answer's save (in flight for a repeatable call) must land; its failure (a lost claim) is reported instead.
          await this.settleSave();
          throw error;
        }
        this.count('tool_call', { toolCalls: 1, wastedToolCalls: 1 }, call.name);
        throw new SectionAttemptError(`tool ${call.name} (${call.id}) threw: ${describeError(error)}`, { cause: error });
      }
      this.count('tool_call', { toolCalls: 1 }, call.name);
      this.recordResult(call, result);
      // Settled before the next tool call, or (the group's last result) when the next model call ends: that call overlaps it.
      this.saveInBackground();
    }
    const refused = open.filter((entry) => !allowed.has(entry.id));
    if (refused.length === 0) return;
    await this.settleSave();
    const why = toolError(
      `Not run: one answer may ask for at most ${this.policy.maxToolCallsPerAnswer} tool calls and this one asked for ${asked.length}. Ask again, in a later turn, for what you still need.`,
    );
    for (const call of refused) this.recordResult(call, why);
    this.saveInBackground();
  }

  /** A call with no external effect (the toolbox says so); unknown tools and toolboxes that do not say count as effectful. */
  private repeatable(call: ToolCall): boolean {
    return this.deps.toolbox.repeatable?.(call.name) === true;
  }

  private recordResult(call: ToolCall, result: ToolResult): void {
    const sources = numberSources(this.messages, result.sources ?? []);
    const content = result.content + citationKey(sources);
    this.messages.push(
      sources.length === 0 ? { role: 'tool', toolCallId: call.id, name: call.name, content } : { role: 'tool', toolCallId: call.id, name: call.name, content, sources },
    );
  }

  /** A call ID that is empty, repeated in the answer, or already used in the thread; null when all are fine. */
  private unusableCallId(message: Extract<ChatMessage, { role: 'assistant' }>): string | null {
    const seen = new Set(this.messages.flatMap((entry) => (entry.role === 'assistant' ? (entry.toolCalls ?? []).map((call) => call.id) : [])));
    for (const call of message.toolCalls ?? []) {
      if (call.id === '' || seen.has(call.id)) return JSON.stringify(call.id);
      seen.add(call.id);
    }
    return null;
  }

  /** After a failed attempt: warm retry if the thread can be shown sound, else cold, else skipped. */
  private async recover(failure: unknown): Promise<SectionOutcome | null> {
    const why = describeError(failure);
    let warmRefusal = '';
    if (this.attempts.warm < this.policy.warmRetries) {
      const warm = this.prepareWarm(failure);
      if (warm.ok) {
        this.attempts = { ...this.attempts, warm: this.attempts.warm + 1 };
        this.waste(warm.dropped, `warm retry after ${why}`);
        this.messages = warm.messages;
        await this.save();
        return null;
      }
      warmRefusal = `; warm retry impossible: ${warm.reason}`;
    }
    if (this.attempts.cold < this.policy.coldRetries) {
      await this.startColdThread(`cold retry after ${why}${warmRefusal}`, true);
      return null;
    }
    this.waste(this.messages, `section skipped after ${why}`);
    const reason =
      `retries exhausted (warm ${this.attempts.warm}/${this.policy.warmRetries}, cold ${this.attempts.cold}/${this.policy.coldRetries}); ` +
      `last error: ${why}${warmRefusal}`;
    return { kind: 'skipped', reason, tally: this.tally, attempts: this.outcomeAttempts() };
  }

  private prepareWarm(failure: unknown): { ok: true; messages: ChatMessage[]; dropped: ChatMessage[] } | { ok: false; reason: string } {
    const repaired = repairForWarmRetry(this.messages, this.spec.promptId);
    if (!repaired.sound) return { ok: false, reason: repaired.reason };
    let messages = repaired.messages;
    if (failure instanceof ContextWindowError) {
      // Compaction only ever sees a sanitised transcript: compacting a broken one gives a smaller broken one.
      const target = Math.floor(
        Math.min(this.deps.provider.contextWindowTokens * this.policy.compactToWindowShare, estimateTokens(messages) * MAX_SHARE_AFTER_COMPACTION),
      );
      const compacted = compactTranscript(messages, target);
      if (compacted === null) return { ok: false, reason: `the transcript cannot be compacted under ${target} tokens` };
      messages = compacted;
    }
    const problem = findResumeProblems(messages)[0];
    if (problem !== undefined) return { ok: false, reason: `the prepared transcript is unsound (${problem.kind})` };
    return { ok: true, messages, dropped: repaired.dropped };
  }

  private async startColdThread(why: string, spendsColdRetry: boolean): Promise<void> {
    this.waste(this.messages, why);
    this.generation += 1;
    if (spendsColdRetry) this.attempts = { ...this.attempts, cold: this.attempts.cold + 1 };
    this.messages = this.freshThread();
    await this.save();
  }

  /**
   * The first thread is the prompt alone. A clean thread (generation > 0) adds the rolling context
   * and says it is a fresh start: it is a new conversation, and nothing in it may read as the old
   * one (a deterministic model would otherwise give its tool calls the IDs of calls already run).
   */
  private freshThread(): ChatMessage[] {
    const parts = [this.spec.prompt];
    if (this.generation > 0) {
      if (this.spec.coldContext.trim() !== '') parts.push(this.spec.coldContext);
      parts.push(freshStartNote(this.generation));
    }
    const sources = numberSources([], this.spec.sources ?? []);
    const content = parts.join('\n\n') + citationKey(sources);
    const promptId = this.spec.promptId;
    return [
      { role: 'system', content: this.spec.system },
      sources.length === 0 ? { role: 'user', content, promptId } : { role: 'user', content, promptId, sources },
    ];
  }

  /**
   * One model call with in-call retries of transient provider errors (full jitter, retry-after
   * honoured), all inside the step's remaining time. Without time for the call the section is out
   * of time; without time for a retry the provider's error is thrown out (an outage the engine
   * backs off from), so a failing provider is never mistaken for a slow step.
   */
  private async callModel(): Promise<ChatResponse> {
    // Sources are the pipeline's bookkeeping: the model reads them in the message text (the key).
    const messages = this.messages.map(withoutSources);
    let lastFailure: PhaselineError | null = null;
    for (let attemptNumber = 1; ; attemptNumber += 1) {
      const leftMs = this.remainingMs();
      if (leftMs < this.policy.minCallTimeMs) {
        if (lastFailure !== null) throw lastFailure;
        throw new OutOfTimeError(`${Math.max(0, Math.round(leftMs))} ms left in the step, less than the ${this.policy.minCallTimeMs} ms a model call needs`);
      }
      await this.readyForCall();
      await this.stopIfSaveFailed();
      // The save still in flight (the last tool result's) overlaps this call; if it fails (a lost claim), the call is cut short.
      // Combined keeping the step signal's check on every read (a lapsed lease), which the provider's look before it starts relies on.
      const saving = this.pendingSave;
      const signal = saving === null ? this.signal : anyKeepingChecks(this.signal, saveFailure(saving));
      const cutByStep = leftMs < this.policy.callTimeoutMs;
      const timeoutMs = Math.floor(Math.min(this.policy.callTimeoutMs, leftMs));
      let response: ChatResponse;
      /** What the provider bills for this call if the step aborts it midway (a cancel, a lost claim, a stall). */
      let billedAfterAbort: BilledCall | null = null;
      try {
        const onText = this.deps.onDraft;
        response = await this.deps.provider.chat({
          messages,
          tools: this.deps.toolbox.specs,
          signal,
          timeoutMs,
          ...(onText ? { onText } : {}),
          // Charged inside the abort itself: the step that stops on it settles its spend next, without waiting for this call to unwind.
          onBilledAfterAbort: (billed) => {
            billedAfterAbort = billed;
            this.deps.spend?.charge(billed.costUsd);
          },
        });
      } catch (error) {
        // A failed call may still have been billed: an answer refused after the provider reported its usage, or cut off midway, carries that cost; its output is thrown away.
        const billed = billedAfterAbort as BilledCall | null;
        const billedUsd = billed !== null ? billed.costUsd : error instanceof PhaselineError && error.billedUsd !== undefined && error.billedUsd > 0 ? error.billedUsd : 0;
        if (billed === null) this.deps.spend?.charge(billedUsd);
        this.count('model_call', { modelCalls: 1, wastedModelCalls: 1, usd: billedUsd, wastedUsd: billedUsd }, `${this.deps.provider.name} failed: ${describeError(error)}`);
        // The save this call overlapped: if it failed (a lost claim, which also cut the call short), that is what the section reports.
        await this.settleSave();
        this.signal.throwIfAborted();
        if (!isProviderOutage(error)) throw error;
        if (error instanceof ProviderTimeoutError && cutByStep && this.remainingMs() < this.policy.minCallTimeMs) {
          // The step's deadline, not the provider's own timeout, ended this call.
          if (lastFailure !== null) throw lastFailure;
          throw new OutOfTimeError(`the model call was cut at the step's deadline after ${timeoutMs} ms`);
        }
        if (attemptNumber > this.policy.transientRetries) throw error;
        const retryAfterMs = error.retryAfterMs ?? 0;
        // A long retry-after is the engine's to wait out (it requeues the job for later).
        if (retryAfterMs > this.policy.transientMaxDelayMs) throw error;
        const waitMs = Math.max(retryAfterMs, this.backoffMs(attemptNumber));
        if (waitMs + this.policy.minCallTimeMs > this.remainingMs()) throw error;
        lastFailure = error;
        await this.sleep(waitMs);
        continue;
      }
      this.deps.spend?.charge(response.costUsd);
      this.count(
        'model_call',
        { modelCalls: 1, inputTokens: response.usage.inputTokens, outputTokens: response.usage.outputTokens, usd: response.costUsd },
        this.deps.provider.name,
      );
      // The save this call overlapped is on record before its answer is used (appended, its calls run, returned as the text).
      await this.settleSave();
      return response;
    }
  }

  private remainingMs(): number {
    return this.deps.remainingMs?.() ?? Number.POSITIVE_INFINITY;
  }

  /** Full jitter: uniform in [0, min(max, base * 2^(attempt-1))). */
  private backoffMs(attemptNumber: number): number {
    const ceiling = Math.min(this.policy.transientMaxDelayMs, this.policy.transientMinDelayMs * 2 ** Math.max(0, attemptNumber - 1));
    return Math.floor(this.random() * ceiling);
  }

  private sleep(ms: number): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const onAbort = (): void => {
        this.timers.clearTimeout(handle);
        reject(this.signal.reason as Error);
      };
      const handle = this.timers.setTimeout(() => {
        this.signal.removeEventListener('abort', onAbort);
        resolve();
      }, ms);
      if (this.signal.aborted) onAbort();
      else this.signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  private append(message: ChatMessage, cost: CallCost): void {
    this.costs.set(message, cost);
    this.messages.push(message);
  }

  /** Counts the discarded model and tool outputs among `messages` as wasted. */
  private waste(messages: readonly ChatMessage[], why: string): void {
    const delta = { wastedModelCalls: 0, wastedToolCalls: 0, wastedInputTokens: 0, wastedOutputTokens: 0, wastedUsd: 0 };
    for (const message of messages) {
      if (message.role === 'tool') delta.wastedToolCalls += 1;
      if (message.role !== 'assistant') continue;
      // Answers loaded from storage have no per-call cost on record: the call is counted, its tokens are not.
      const cost = this.costs.get(message);
      delta.wastedModelCalls += 1;
      delta.wastedInputTokens += cost?.inputTokens ?? 0;
      delta.wastedOutputTokens += cost?.outputTokens ?? 0;
      delta.wastedUsd += cost?.usd ?? 0;
    }
    if (delta.wastedModelCalls + delta.wastedToolCalls > 0) this.count('wasted', delta, why);
  }

  /** A model answer that is counted spent already and thrown away before it joined the thread. */
  private wasteCall(cost: CallCost, why: string): void {
    this.count('wasted', { wastedModelCalls: 1, wastedInputTokens: cost.inputTokens, wastedOutputTokens: cost.outputTokens, wastedUsd: cost.usd }, why);
  }

  private count(kind: UsageEntry['kind'], increments: Partial<CostTally>, detail: string): void {
    const delta = addTallies(EMPTY_TALLY, increments);
    this.tally = addTallies(this.tally, delta);
    this.deps.onUsage?.({ sectionId: this.spec.sectionId, generation: this.generation, kind, delta, detail });
  }

  /**
   * Before a model call: the spend cap checked while the last save is still in flight (the call
   * overlaps it too; callModel settles it when the call ends). On a refusal the section stops, so
   * the save is settled first: a failed save is reported before a refusal.
   */
  private async readyForCall(): Promise<void> {
    try {
      await this.deps.spend?.beforeCall();
    } catch (refusal) {
      await this.settleSave();
      throw refusal;
    }
  }

  /** Starts a save without waiting for it; the next save, the end of the next model call, a call that needs it on record, or the section's end waits for it (settleSave). */
  private saveInBackground(): void {
    const saving = this.save();
    // Awaited by settleSave; until then a failure must not be an unhandled rejection, and is noted at once.
    saving.catch((error: unknown) => {
      this.saveFailed ??= { error };
    });
    this.pendingSave = saving;
  }

  /**
   * Before a repeatable call or a model call, which do not wait for the saves before them: a save
   * that failed already ends the section (its error is the one reported) instead of the signal it
   * aborts, which the next call would only see once it had been sent.
   */
  private async stopIfSaveFailed(): Promise<void> {
    const failed = this.saveFailed;
    if (failed === null) return;
    await this.settleSave();
    throw failed.error;
  }

  /** Waits for the save in flight, if any, and reports its failure. */
  private async settleSave(): Promise<void> {
    const pending = this.pendingSave;
    this.pendingSave = null;
    if (!pending) return;
    try {
      await pending;
    } catch (error) {
      // Reported here: the failure noted for stopIfSaveFailed is this one (each save waits for the one before).
      this.saveFailed = null;
      throw error;
    }
  }

  private async save(): Promise<void> {
    const transcript = this.snapshot();
    const asked = (this.savesAsked += 1);
    // One save at a time: each appends to the log as the one before left it.
    await this.settleSave();
    // A newer save was asked for while this one waited its turn: that one holds all of this one and is the one waited for.
    if (asked !== this.savesAsked) return;
    await this.deps.transcripts.save(this.spec.sectionId, transcript);
  }

  /**
   * The final answer's save: handed to the port to make behind the work when it can (the section
   * returns while it commits, and the port keeps it on record before anything after it), else
   * waited for. Either way after every save before it.
   */
  private async saveAnswer(): Promise<void> {
    const { transcripts } = this.deps;
    if (transcripts.saveBehind === undefined) return this.save();
    const transcript = this.snapshot();
    this.savesAsked += 1;
    await this.settleSave();
    transcripts.saveBehind(this.spec.sectionId, transcript);
  }

  private snapshot(): StoredTranscript {
    return { generation: this.generation, messages: [...this.messages], attempts: { ...this.attempts }, tally: this.tally };
  }

  private written(text: string): SectionOutcome {
    return { kind: 'written', text, sources: threadSources(this.messages), tally: this.tally, attempts: this.outcomeAttempts() };
  }

  private outcomeAttempts(): SectionAttempts {
    return { warm: this.attempts.warm, cold: this.attempts.cold, generation: this.generation };
  }
}

/** Aborted with the save's error if it fails; never rejects. */
function saveFailure(saving: Promise<void>): AbortSignal {
  const controller = new AbortController();
  saving.catch((error: unknown) => controller.abort(error));
  return controller.signal;
}

/** Every call of the answer that opens the thread's trailing group of tool results (none when it ends otherwise). */
function trailingAnswerCalls(messages: readonly ChatMessage[]): readonly ToolCall[] {
  let at = messages.length - 1;
  while (messages[at]?.role === 'tool') at -= 1;
  const head = messages[at];
  return head?.role === 'assistant' ? (head.toolCalls ?? []) : [];
}

/** The line that marks a clean thread; it names the generation so that every clean thread differs. */
export function freshStartNote(generation: number): string {
  return `(Fresh start ${generation}: earlier attempts at this section were discarded; begin again from the prompt.)`;
}

/**
 * The final answer a previous worker recorded before it could hand the section over: the last
 * message is non-empty assistant text without tool calls, and everything before it repairs soundly
 * with nothing dropped. Returns null otherwise.
 */
function recordedAnswer(messages: readonly ChatMessage[], promptId: string): string | null {
  const last = messages.at(-1);
  if (last?.role !== 'assistant' || (last.toolCalls?.length ?? 0) > 0 || last.content === null || last.content.trim() === '') return null;
  const before = repairForWarmRetry(messages.slice(0, -1), promptId);
  if (!before.sound || before.dropped.length > 0) return null;
  return last.content;
}
