/**
 * The section runner under a claim that may be gone: the signal a model call gets while a save
 * overlaps it still checks the lease on every read (as the step's own signal does, core/lease-guard.ts),
 * and a tool that cannot answer yet does not hide a save that failed under it. The real section
 * runner, the scripted model through the AI SDK adapter, an injected clock and the engine's own lease
 * guard on the step signal; saves land or fail when the test says so.
 */
import type { LanguageModelV3Prompt } from '@ai-sdk/provider';
import type { ChatRequest, ChatResponse, ModelProvider } from '../../functions/src/agent/provider';
import { runSection, type SectionSpec, type StoredTranscript, type TranscriptPort } from '../../functions/src/agent/section-runner';
import { ToolWaitError, type Toolbox, type ToolResult } from '../../functions/src/agent/tools';
import { ManualClock } from '../../functions/src/core/clock';
import { OwnershipLostError } from '../../functions/src/core/errors';
import { abortedAlready, abortOnLapse, anyKeepingChecks, LeaseGuard, LeaseLapsedError } from '../../functions/src/core/lease-guard';
import { DEFAULT_ENGINE_OPTIONS, holderStopAgeMs } from '../../functions/src/core/options';
import { scriptedModel, scriptedProvider, shownResults, type ScriptedTurn } from '../support/scripted-model';

const spec: SectionSpec = { sectionId: 's', promptId: 'p', system: 'sys', prompt: 'write', coldContext: '', maxToolRounds: 4 };
const tick = () => new Promise((resolve) => setImmediate(resolve));

function gate(): { promise: Promise<void>; open: () => void } {
  let open: () => void = () => undefined;
  const promise = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

/** The step's signal as a claim scope makes it: aborted on its own once no renewal is confirmed for the holder's stop age. */
function stepSignal(clock: ManualClock): { controller: AbortController; signal: AbortSignal } {
  const guard = new LeaseGuard(clock, holderStopAgeMs(DEFAULT_ENGINE_OPTIONS), clock.now());
  const controller = new AbortController();
  return { controller, signal: abortOnLapse(controller, () => guard.lapse()) };
}

/** Saves of messages `held` picks wait for the test (land or fail); the others land at once. */
class HeldTranscripts implements TranscriptPort {
  readonly held: { what: string; land: () => void; fail: (error: Error) => void }[] = [];
  constructor(private readonly hold: (transcript: StoredTranscript) => string | null) {}
  load(): Promise<StoredTranscript | null> {
    return Promise.resolve(null);
  }
  save(_id: string, transcript: StoredTranscript): Promise<void> {
    const what = this.hold(transcript);
    if (what === null) return Promise.resolve();
    return new Promise<void>((resolve, reject) => this.held.push({ what, land: resolve, fail: reject }));
  }
  async next(what: string): Promise<{ land: () => void; fail: (error: Error) => void }> {
    for (let i = 0; i < 50 && this.held.length === 0; i += 1) await tick();
    const save = this.held.shift();
    if (save === undefined) throw new Error(`no held save (expected ${what})`);
    expect(save.what).toBe(what);
    return save;
  }
}

const lastRole = (transcript: StoredTranscript): string => {
  const last = transcript.messages.at(-1);
  return last?.role === 'assistant' && (last.toolCalls?.length ?? 0) > 0 ? 'calls' : (last?.role ?? '?');
};

/** A toolbox of one repeatable tool (no effect: it may run while the answer that asked for it is being saved). */
function repeatableToolbox(execute: () => Promise<ToolResult>): Toolbox & { runs: number } {
  const toolbox = {
    runs: 0,
    specs: [{ name: 'search', description: 'd', parameters: { type: 'object' } }],
    execute: () => {
      toolbox.runs += 1;
      return execute();
    },
    repeatable: () => true,
  };
  return toolbox;
}

/** Asks for one search, then answers once it has seen a result. */
const searchThenAnswer = (prompt: LanguageModelV3Prompt): ScriptedTurn =>
  shownResults(prompt).length === 0 ? { toolCalls: [{ id: 'a', name: 'search', input: {} }] } : { text: 'Done.' };

/**
 * A provider that waits before each call after the first (a rate limiter's slot, a token refresh)
 * and then, as a fetch-based provider does, looks at `signal.aborted` before it sends its request;
 * the request goes to the scripted model (through the AI SDK adapter). `sent` counts the requests
 * that got past that look.
 */
function queuedProvider(inner: ModelProvider, slot: Promise<void>, waiting: () => void): ModelProvider & { signals: AbortSignal[]; sent: number } {
  const provider = {
    name: inner.name,
    contextWindowTokens: inner.contextWindowTokens,
    signals: [] as AbortSignal[],
    sent: 0,
    async chat(request: ChatRequest): Promise<ChatResponse> {
      provider.signals.push(request.signal);
      if (provider.signals.length > 1) {
        waiting();
        await slot;
      }
      if (request.signal.aborted) throw request.signal.reason as Error;
      provider.sent += 1;
      return inner.chat(request);
    },
  };
  return provider;
}

describe('the signal a model call gets while a save overlaps it', () => {
  test('bug 41: a provider that looks at its signal before it starts, after the lease lapsed, starts no call', async () => {
    const clock = new ManualClock();
    const { signal } = stepSignal(clock);
    const model = scriptedModel(searchThenAnswer);
    const slot = gate();
    const waiting = gate();
    const provider = queuedProvider(scriptedProvider(model), slot.promise, waiting.open);
    // The result's save stays in flight, so the next model call overlaps it.
    const transcripts = new HeldTranscripts((transcript) => (lastRole(transcript) === 'tool' ? 'result' : null));
    const toolbox = repeatableToolbox(() => Promise.resolve({ ok: true, content: 'r' }));
    const run = runSection(spec, { provider, toolbox, transcripts, signal, random: () => 0.5 });
    run.catch(() => undefined);

    await waiting.promise;
    // The call overlapping the save got a signal of its own.
    expect(provider.signals[1]).not.toBe(signal);
    // Frozen while waiting for its slot: on waking, no renewal has been confirmed for the stop age.
    clock.advance(holderStopAgeMs(DEFAULT_ENGINE_OPTIONS));
    slot.open();
    (await transcripts.next('result')).land();

    await expect(run).rejects.toBeInstanceOf(LeaseLapsedError);
    // Only the first request was sent.
    expect(provider.sent).toBe(1);
  });
});

describe('anyKeepingChecks', () => {
  test("a read of the combined signal runs the step signal's check, and the combined signal carries its reason", () => {
    const clock = new ManualClock();
    const { signal } = stepSignal(clock);
    const combined = anyKeepingChecks(signal, new AbortController().signal);
    expect(combined.aborted).toBe(false);
    clock.advance(holderStopAgeMs(DEFAULT_ENGINE_OPTIONS));
    // Nothing has read the step signal since the lapse: the combined one's read is the first.
    expect(abortedAlready(signal)).toBe(false);
    expect(combined.aborted).toBe(true);
    expect(combined.reason).toBeInstanceOf(LeaseLapsedError);
    expect(signal.reason).toBe(combined.reason);
  });

  test('throwIfAborted checks too, and an abort of the other source keeps its own reason', () => {
    const clock = new ManualClock();
    const { signal } = stepSignal(clock);
    clock.advance(holderStopAgeMs(DEFAULT_ENGINE_OPTIONS));
    expect(() => anyKeepingChecks(signal, new AbortController().signal).throwIfAborted()).toThrow(LeaseLapsedError);

    const fresh = stepSignal(new ManualClock());
    const other = new AbortController();
    const combined = anyKeepingChecks(fresh.signal, other.signal);
    const saveFailed = new Error('save failed');
    other.abort(saveFailed);
    expect(() => combined.throwIfAborted()).toThrow(saveFailed);
    expect(fresh.signal.aborted).toBe(false);
  });
});

describe('a tool that cannot answer yet while the answer that asked for it is being saved', () => {
  const lostClaim = () => new OwnershipLostError('claim epoch 1 no longer owns job j');
  const refused = () => new Error('transcript write refused: too large');

  test.each([
    ['a lost claim', lostClaim],
    ['a refused write', refused],
  ])('bug 42: the save failing under it (%s) is what the section reports, not the wait', async (_what, failure) => {
    const clock = new ManualClock();
    const { controller, signal } = stepSignal(clock);
    const model = scriptedModel(searchThenAnswer);
    // The answer's save (the one with the call) stays in flight while the repeatable call runs.
    const transcripts = new HeldTranscripts((transcript) => (lastRole(transcript) === 'calls' ? 'calls' : null));
    const toolbox = repeatableToolbox(() => Promise.reject(new ToolWaitError('search: the index is down', clock.now() + 60_000)));
    const run = runSection(spec, { provider: scriptedProvider(model), toolbox, transcripts, signal, random: () => 0.5 });
    run.catch(() => undefined);

    const save = await transcripts.next('calls');
    for (let i = 0; i < 50 && toolbox.runs === 0; i += 1) await tick();
    expect(toolbox.runs).toBe(1);
    const error = failure();
    // As the engine's transcript writes do (durable-writes stopOnLoss): a lost claim aborts the claim too.
    if (error instanceof OwnershipLostError) controller.abort(error);
    save.fail(error);

    await expect(run).rejects.toBe(error);
  });

  test('with its answer on record, the wait is what the section reports', async () => {
    const clock = new ManualClock();
    const { signal } = stepSignal(clock);
    const wait = new ToolWaitError('search: the index is down', clock.now() + 60_000);
    const transcripts = new HeldTranscripts((transcript) => (lastRole(transcript) === 'calls' ? 'calls' : null));
    const toolbox = repeatableToolbox(() => Promise.reject(wait));
    const run = runSection(spec, { provider: scriptedProvider(scriptedModel(searchThenAnswer)), toolbox, transcripts, signal, random: () => 0.5 });
    run.catch(() => undefined);
    const save = await transcripts.next('calls');
    for (let i = 0; i < 50 && toolbox.runs === 0; i += 1) await tick();
    save.land();
    await expect(run).rejects.toBe(wait);
  });
});
