/**
 * The research pipeline's agent sections over a step context with in-memory transcripts, an
 * in-memory provider circuit and an injected clock: what a provider's Retry-After turns into
 * (bug 4) and how a section that runs out of step time ends (bug 11). The OpenAI-compatible
 * provider answers through an injected fetch, so its own Retry-After parsing is part of the path.
 */
import { afterOutage, circuitState, CLOSED_CIRCUIT, DEFAULT_CIRCUIT_POLICY, type CircuitRecord, type ProviderCircuit } from '../../functions/src/core/circuit';
import { ProviderRateLimitedError, type ModelProvider } from '../../functions/src/agent/provider';
import { ManualClock } from '../../functions/src/core/clock';
import type { PhaseDefinition, StepContext } from '../../functions/src/core/pipeline';
import { DEFAULT_MAX_SERVER_DELAY_SECONDS } from '../../functions/src/core/server-delay';
import { refusingEffectLedger } from '../../functions/src/effects/ledger';
import { createStepContext } from '../../functions/src/engine/context';
import { createResearchPipeline, researchInput, type ResearchDeps, type ResearchInput } from '../../functions/src/pipelines/research';
import { describeDelay, overLongDelayQuestion, storedTranscriptSchema } from '../../functions/src/agent';
import { createCorpusToolbox, createOfflineProvider } from '../../functions/src/providers/offline';
import { createOpenAiCompatibleProvider } from '../../functions/src/providers/openai-compatible';

const CAP_MS = DEFAULT_MAX_SERVER_DELAY_SECONDS * 1000;
const STEP_MS = 300_000;
const input: ResearchInput = researchInput.parse({ question: 'How do leases and fencing tokens keep stale workers out?', experts: 1, sections: 1 });

class MemoryCircuit implements ProviderCircuit {
  record: CircuitRecord = CLOSED_CIRCUIT;
  check(nowMs: number) {
    return Promise.resolve(circuitState(this.record, nowMs));
  }
  recordOutage(nowMs: number, detail: string) {
    this.record = afterOutage(this.record, nowMs, DEFAULT_CIRCUIT_POLICY, detail);
    return Promise.resolve(circuitState(this.record, nowMs));
  }
  recordSuccess() {
    this.record = CLOSED_CIRCUIT;
    return Promise.resolve();
  }
}

interface Rig {
  readonly clock: ManualClock;
  readonly transcripts: Map<string, unknown>;
  readonly notes: string[];
  readonly outline: PhaseDefinition<ResearchInput, unknown>;
  context(): StepContext<ResearchInput>;
}

function rig(provider: (clock: ManualClock) => ModelProvider, clock = new ManualClock(Date.UTC(2026, 0, 1))): Rig {
  const transcripts = new Map<string, unknown>();
  const notes: string[] = [];
  const deps: ResearchDeps = {
    provider: provider(clock),
    toolbox: createCorpusToolbox({ seed: 3 }),
    circuit: new MemoryCircuit(),
    policy: { transientRetries: 1, transientMinDelayMs: 1, transientMaxDelayMs: 5_000 },
    timers: { setTimeout: (callback) => setImmediate(callback), clearTimeout: (handle) => clearImmediate(handle as NodeJS.Immediate) },
  };
  const outline = createResearchPipeline(() => deps).phases[0] as PhaseDefinition<ResearchInput, unknown>;
  return {
    clock,
    transcripts,
    notes,
    outline,
    context: () => {
      const context = createStepContext<ResearchInput>({
        jobId: 'job-1',
        input,
        unit: null,
        decisions: {},
        signal: new AbortController().signal,
        clock,
        random: () => 0.5,
        phase: outline,
        states: new Map(),
        sections: [],
        flusher: null,
        deadlineMs: clock.now() + STEP_MS,
        budgetMs: STEP_MS,
        limits: { maxServerDelayMs: CAP_MS },
        durable: {
          writeSection: () => Promise.resolve(),
          loadTranscript: (sectionId) => Promise.resolve(transcripts.get(sectionId) ?? null),
          saveTranscript: (sectionId, transcript) => {
            transcripts.set(sectionId, structuredClone(transcript));
            return Promise.resolve();
          },
          saveTranscriptBehind: (sectionId, transcript) => {
            transcripts.set(sectionId, structuredClone(transcript));
          },
          refuse: (error) => {
            throw error;
          },
          afterWrites: (report) => report(),
          drain: () => Promise.resolve(),
          effects: refusingEffectLedger('test'),
        },
      });
      return { ...context, note: (kind, message) => notes.push(`${kind}: ${message}`) };
    },
  };
}

/** An OpenAI-compatible provider whose every answer is a 429 with this Retry-After. */
function rateLimitedWith(retryAfter: string) {
  return (clock: ManualClock): ModelProvider =>
    createOpenAiCompatibleProvider(
      { baseUrl: 'http://127.0.0.1:9/v1', model: 'm', timeoutMs: 60_000, contextWindowTokens: 128_000, inputUsdPer1kTokens: 0, outputUsdPer1kTokens: 0 },
      {
        clock,
        fetch: () =>
          Promise.resolve(new Response(JSON.stringify({ error: { message: 'rate limited' } }), { status: 429, headers: { 'retry-after': retryAfter } })),
      },
    );
}

describe('bug 4: a provider asking for a delay past the cap waits as an outage with a stated resume time', () => {
  test.each([
    ['86400 s (a day)', '86400', '24 h'],
    ['an HTTP date in 2100', 'Fri, 01 Jan 2100 00:00:00 GMT', '74 years'],
    ['10^15 ms', '1000000000000', '31,688 years'],
  ])('bug 4: Retry-After of %s: the phase waits (reason provider) until now + the cap, and says why', async (_label, header, said) => {
    const r = rig(rateLimitedWith(header));
    const nowMs = r.clock.now();

    const outcome = await r.outline.run?.(r.context());

    const untilMs = nowMs + CAP_MS;
    expect(outcome).toEqual({
      kind: 'wait',
      reason: 'provider',
      questionId: 'provider',
      untilMs,
      question: `Provider openai-compatible:m asked to wait ${said} before the next request; a wait over 15 min is treated as an outage, so the job resumes by itself at ${new Date(untilMs).toISOString()}.`,
    });
    expect(Number.isSafeInteger(untilMs)).toBe(true);
  });

  test('bug 4: a delay within the cap but too long to wait in the call is handed to the engine as it is', async () => {
    const r = rig(rateLimitedWith('600'));
    const failure = await r.outline.run?.(r.context()).then(
      () => null,
      (error: unknown) => error,
    );
    expect(failure).toBeInstanceOf(ProviderRateLimitedError);
    expect(failure).toMatchObject({ retryAfterMs: 600_000 });
  });

  test('delays read as a person would say them', () => {
    expect([describeDelay(90_000), describeDelay(CAP_MS), describeDelay(86_400_000), describeDelay(3 * 86_400_000)]).toEqual(['90 s', '15 min', '24 h', '3 days']);
    expect(overLongDelayQuestion('p', 86_400_000, CAP_MS, Date.UTC(2026, 0, 1, 0, 15))).toBe(
      'Provider p asked to wait 24 h before the next request; a wait over 15 min is treated as an outage, so the job resumes by itself at 2026-01-01T00:15:00.000Z.',
    );
  });
});

/** The offline provider at 100 s a call, its latency moving the manual clock. */
const slowOffline = (clock: ManualClock) =>
  createOfflineProvider({
    seed: 3,
    clock,
    settings: { latencyMs: 100_000 },
    sleep: (ms) => {
      clock.advance(ms);
      return Promise.resolve();
    },
  });

describe('bug 11: a research section slower than the step ends the phase with a yield, not a killed worker', () => {
  test('bug 11: a provider taking 100 s a call: the outline yields at the deadline with its transcript saved, and the next step completes it', async () => {
    const r = rig(slowOffline);
    const stepStartMs = r.clock.now();

    const first = await r.outline.run?.(r.context());

    expect(first).toEqual({ kind: 'yield' });
    expect(r.clock.now()).toBeLessThanOrEqual(stepStartMs + STEP_MS);
    expect(r.notes.some((note) => note.startsWith('section-yielded: outline'))).toBe(true);
    const saved = r.transcripts.get('outline') as { messages: unknown[] };
    expect(saved.messages.length).toBeGreaterThan(2);

    let outcome = first;
    for (let step = 0; step < 5 && outcome?.kind === 'yield'; step += 1) outcome = await r.outline.run?.(r.context());
    expect(outcome).toMatchObject({ kind: 'done' });
  });
});

describe('sources in stored transcripts', () => {
  type Saved = { messages: { role: string; sources?: { url: string; number: number }[] }[] };

  test('the sources of tool results saved in one step are still on them after the next steps load, validate and continue the transcript', async () => {
    const r = rig(slowOffline);
    expect(await r.outline.run?.(r.context())).toEqual({ kind: 'yield' });
    const firstResults = (r.transcripts.get('outline') as Saved).messages.filter((message) => message.role === 'tool');
    expect(firstResults.length).toBeGreaterThan(0);
    expect(firstResults.every((message) => (message.sources?.length ?? 0) > 0)).toBe(true);
    expect(firstResults[0]?.sources?.[0]).toMatchObject({ url: expect.stringMatching(/^https:\/\/corpus\.phaseline\.invalid\//) as unknown, number: 1 });

    let outcome: unknown = { kind: 'yield' };
    for (let step = 0; step < 5 && (outcome as { kind: string }).kind === 'yield'; step += 1) outcome = await r.outline.run?.(r.context());
    expect(outcome).toMatchObject({ kind: 'done' });
    expect(r.notes.filter((note) => note.startsWith('transcript-refused'))).toEqual([]);
    const finalResults = (r.transcripts.get('outline') as Saved).messages.filter((message) => message.role === 'tool');
    expect(finalResults.slice(0, firstResults.length)).toEqual(firstResults);
  });

  test('a transcript saved before sources were recorded still validates; one with sources keeps them', () => {
    const old = {
      generation: 0,
      messages: [
        { role: 'system', content: 's' },
        { role: 'user', content: 'p', promptId: 'outline' },
        { role: 'assistant', content: null, toolCalls: [{ id: 'c1', name: 'search', arguments: '{}' }] },
        { role: 'tool', toolCallId: 'c1', name: 'search', content: 'r' },
      ],
      attempts: { warm: 0, cold: 0 },
      tally: { modelCalls: 1, toolCalls: 1, inputTokens: 0, outputTokens: 0, usd: 0, wastedModelCalls: 0, wastedToolCalls: 0, wastedInputTokens: 0, wastedOutputTokens: 0, wastedUsd: 0 },
    };
    expect(storedTranscriptSchema.parse(old)).toEqual(old);
    const sources = [{ url: 'https://a.example/', title: 'A', passage: 'p', fetchedAt: '2026-01-01T00:00:00.000Z', artifact: { ref: 'x', sha256: 'y', size: 3 }, number: 1 }];
    const withSources = { ...old, messages: [...old.messages.slice(0, 3), { ...old.messages[3], sources }] };
    expect(storedTranscriptSchema.parse(withSources)).toEqual(withSources);
  });
});
