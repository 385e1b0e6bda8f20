/**
 * The effect keys of defined tools, on the real engine, the real effect ledger and the Firestore
 * emulator, the model the AI SDK's mock scripted per thread: which calls are one effect and which
 * are two (without `identity`: the section, the tool and the arguments; with it: the identity), and
 * a call whose key already holds an effect recorded with other arguments, which is refused.
 */
import type { LanguageModelV3Prompt } from '@ai-sdk/provider';
import type { MockLanguageModelV3 } from 'ai/test';
import { z } from 'zod';
import {
  agentWait,
  createToolbox,
  defineTool,
  runAgentSection,
  type AgentDeps,
  type ApplyOutcome,
  type LookupOutcome,
} from '../../functions/src/agent';
import { deriveEffectKey, intentFingerprint } from '../../functions/src/core/effect-keys';
import { effectEntrySchema, type EffectIntent, type EffectState } from '../../functions/src/core/effect-ledger';
import { definePhase, definePipeline, pipelineRegistry } from '../../functions/src/core/pipeline';
import { sweep } from '../../functions/src/engine/sweeper';
import { effectsPath } from '../../functions/src/store/paths';
import { engineSuite } from '../support/engine';
import { immediateTimers } from '../support/research';
import { scriptedModel, scriptedProvider, shownResults, userText, type ScriptedTurn } from '../support/scripted-model';

interface RefundRequest {
  readonly order: string;
  readonly amountCents: number;
}

/** The payments system of record: refunds by idempotency key, every apply request counted. */
class MemoryPayments {
  readonly refunds = new Map<string, RefundRequest & { readonly refundId: string }>();
  readonly applied: RefundRequest[] = [];
  /** When the last apply was answered, by the test's clock. */
  appliedAtMs: number | null = null;

  constructor(private readonly now: () => number) {}

  refund(request: RefundRequest, idempotencyKey: string): Promise<ApplyOutcome> {
    this.applied.push({ order: request.order, amountCents: request.amountCents });
    this.appliedAtMs = this.now();
    const known = this.refunds.get(idempotencyKey);
    const refund = known ?? { ...request, refundId: `R-${this.refunds.size + 1}` };
    this.refunds.set(idempotencyKey, refund);
    return Promise.resolve({ kind: 'applied', evidence: { refundId: refund.refundId, replay: known !== undefined } });
  }

  lookup(idempotencyKey: string): Promise<LookupOutcome> {
    const known = this.refunds.get(idempotencyKey);
    return Promise.resolve(known ? { kind: 'found', evidence: { refundId: known.refundId } } : { kind: 'not-found' });
  }
}

const refundInput = z.strictObject({ order: z.string().min(1), amountCents: z.number().int().positive() });

/** The thread a request belongs to: its phase and section, and its generation (0 for the first thread, from the fresh-start note after). */
interface Thread {
  readonly phase: string;
  readonly section: string;
  readonly generation: number;
  readonly shown: ReturnType<typeof shownResults>;
}

type Script = (thread: Thread) => ScriptedTurn;

let script: Script = () => ({ text: 'Done.' });
let callCount = 0;
/** A new call ID for every call the model makes, as real providers do: a clean thread's call never reuses an old one. */
const call = (name: string, input: unknown) => ({ toolCalls: [{ id: `call-${++callCount}`, name, input }] });

function decide(prompt: LanguageModelV3Prompt): ScriptedTurn {
  const text = userText(prompt);
  const [, section, phase] = /Section ([a-z0-9-]+) of ([a-z0-9-]+)/.exec(text) ?? [];
  if (section === undefined || phase === undefined) throw new Error('the prompt names no section');
  const generation = Number(/Fresh start (\d+)/.exec(text)?.[1] ?? 0);
  return script({ phase, section, generation, shown: shownResults(prompt) });
}

let model: MockLanguageModelV3;
let payments: MemoryPayments;

const pipelineInput = z.strictObject({ sections: z.array(z.string().regex(/^[a-z0-9-]+$/)).min(1) });
type PipelineInput = z.infer<typeof pipelineInput>;

const harness = engineSuite('agent-define-tool', (_firestore, clock) => {
  model = scriptedModel(decide);
  payments = new MemoryPayments(() => clock.now());
  const effect = {
    target: 'the test payments',
    lookup: (key: string) => payments.lookup(key),
    describe: (evidence: Readonly<Record<string, unknown>>) => `Refunded: ${String(evidence.refundId)}`,
  };
  // No identity: the key is the section's, the tool's and the arguments'.
  const refund = defineTool({
    name: 'refund',
    description: 'Refunds an amount of an order.',
    input: refundInput,
    effect,
    execute: (request, { idempotencyKey }) => payments.refund(request, idempotencyKey),
  });
  // One refund per order in the job, whatever the amount asked.
  const refundOrder = defineTool({
    name: 'refund_order',
    description: 'Refunds an order; one refund per order.',
    input: refundInput,
    effect: { ...effect, identity: ({ order }) => `refund:${order}` },
    execute: (request, { idempotencyKey }) => payments.refund(request, idempotencyKey),
  });
  const agent: AgentDeps = {
    provider: scriptedProvider(model),
    toolbox: createToolbox([refund, refundOrder]),
    // A failed attempt goes straight to a clean thread: the cold retry these keys must survive.
    policy: { warmRetries: 0, coldRetries: 1, transientRetries: 0 },
    timers: immediateTimers,
  };
  const phaseNamed = (name: string) => definePhase<PipelineInput, { answers: string[] }>({
    name,
    state: z.object({ answers: z.array(z.string()) }),
    section: z.string(),
    run: async (context) => {
      for (const id of context.input.sections) {
        if (context.sections().some((recorded) => recorded.id === id)) continue;
        const outcome = await runAgentSection(context, agent, {
          sectionId: id,
          promptId: `prompt-${id}`,
          system: 'You handle refunds.',
          prompt: `Section ${id} of ${name}: handle the refunds asked for.`,
          coldContext: '',
          maxToolRounds: 4,
        });
        if (outcome.kind === 'provider-wait') return agentWait(outcome);
        if (outcome.kind === 'out-of-time') return { kind: 'yield' };
        await context.recordSection(id, outcome.kind === 'skipped' ? `skipped: ${outcome.reason}` : outcome.text);
      }
      return { kind: 'done', state: { answers: context.sections().map((recorded) => recorded.data as string) } };
    },
  });
  const sections = phaseNamed('sections');
  const followUp = phaseNamed('follow-up');
  return pipelineRegistry(
    definePipeline<PipelineInput>({
      name: 'refunds',
      description: 'Refunds through effectful agent tools.',
      input: pipelineInput,
      phases: [sections],
      publish: (context) => ({ outcome: 'complete', title: 'Refunds', markdown: context.checkpoint(sections).answers.join('\n'), missing: [] }),
    }),
    definePipeline<PipelineInput>({
      name: 'two-rounds',
      description: 'Refunds in two phases whose sections share IDs.',
      input: pipelineInput,
      phases: [sections, followUp],
      publish: (context) => ({ outcome: 'complete', title: 'Refunds', markdown: [...context.checkpoint(sections).answers, ...context.checkpoint(followUp).answers].join('\n'), missing: [] }),
    }),
  );
}, {
  beforeEach: () => {
    script = () => ({ text: 'Done.' });
    callCount = 0;
    model.doStreamCalls.length = 0;
    // A fresh system of record, so a test's stand-in refund or lookup never outlives it.
    payments = new MemoryPayments(() => harness.clock.now());
  },
});

const ledger = async (jobId: string) => (await harness.firestore.db.collection(effectsPath(jobId)).get()).docs.map((doc) => effectEntrySchema.parse(doc.data()));
const results = (thread: Thread, tool: string) => thread.shown.filter((result) => result.toolName === tool);
/** A tool result as the model read it: a tool error's JSON parsed, any other text as it is. */
function readable(text: string | undefined): unknown {
  try {
    return JSON.parse(text ?? 'null') as unknown;
  } catch {
    return text;
  }
}

/** An entry as an earlier thread or revision left it in the ledger of `jobId` (job-level, epoch 1), and its key. */
async function seedEntry(jobId: string, intent: EffectIntent, state: EffectState, evidence: Record<string, string> | null = null): Promise<string> {
  const key = deriveEffectKey(jobId, null, intent);
  const nowMs = harness.clock.now();
  const sent = state !== 'planned';
  await harness.firestore.db.doc(`${effectsPath(jobId)}/${key}`).create(effectEntrySchema.parse({
    key,
    idempotencyKey: key,
    jobId,
    unit: null,
    intent,
    intentHash: intentFingerprint(intent),
    state,
    attempts: sent ? 1 : 0,
    unknowns: state === 'unknown' ? 1 : 0,
    lookups: 0,
    evidence,
    reconciled: false,
    lastOutcome: null,
    question: null,
    resolution: null,
    epoch: 1,
    createdAtMs: nowMs,
    updatedAtMs: nowMs,
  }));
  return key;
}

/** refund_order's intent for order o-1 as the first call recorded it: 500 cents. */
const REFUND_O1_500: EffectIntent = { kind: 'tool-refund-order', identity: 'refund:o-1', target: 'the test payments', payload: { tool: 'refund_order', arguments: '{"amountCents":500,"order":"o-1"}' } };

test('bug 43: a section that refunded and then failed is retried cold; the clean thread makes the same call under a new call ID: one refund', async () => {
  const cleanThreadCalls: string[] = [];
  script = (thread) => {
    const shown = results(thread, 'refund');
    if (thread.generation === 0) {
      if (shown.length === 0) return call('refund', { amountCents: 500, order: 'o-1' });
      // Refunded, then an answer cut off at the output limit: the attempt fails, and the section starts a clean thread.
      return { cutOff: 'Refun' };
    }
    if (shown.length === 0) {
      cleanThreadCalls.push(`generation ${thread.generation}`);
      // The same arguments in another key order, as a model may (the first call's were in sorted order: the recorded arguments are sorted too, or this one would conflict).
      return call('refund', { order: 'o-1', amountCents: 500 });
    }
    return { text: `Done: ${shown[0]?.text ?? ''}` };
  };
  const jobId = await harness.submit('refunds', { sections: ['s1'] });
  await harness.drain();

  expect(await harness.readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  // The clean thread really ran and called the tool again, under its own call ID.
  expect(cleanThreadCalls).toEqual(['generation 1']);
  expect(callCount).toBe(2);
  // The payments system was asked once: the clean thread's call met the key the first one recorded.
  expect(payments.applied).toEqual([{ order: 'o-1', amountCents: 500 }]);
  expect(await ledger(jobId)).toEqual([expect.objectContaining({ state: 'applied', attempts: 1, evidence: { refundId: 'R-1', replay: false } })]);
  // And the clean thread was told about the refund that was made, not a new one.
  const answered = model.doStreamCalls.map((request) => shownResults(request.prompt)).at(-1);
  expect(answered).toEqual([{ toolName: 'refund', text: 'Refunded: R-1' }]);
});

test('without identity the key is the section, the tool and the arguments: two identical calls in a section are one refund, other arguments or another section another', async () => {
  script = (thread) => {
    const shown = results(thread, 'refund');
    const asks = [
      { order: 'o-1', amountCents: 500 },
      // The same call again in this section: the same effect, answered with the first one's result.
      { order: 'o-1', amountCents: 500 },
      // Other arguments: another effect.
      { order: 'o-1', amountCents: 700 },
    ];
    const ask = thread.section === 's1' ? asks[shown.length] : shown.length === 0 ? asks[0] : undefined;
    return ask === undefined ? { text: `Done: ${shown.map((result) => result.text).join(', ')}` } : call('refund', ask);
  };
  const jobId = await harness.submit('refunds', { sections: ['s1', 's2'] });
  await harness.drain();

  expect(await harness.readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  // s1: 500 once (its second identical call not applied again), then 700; s2: 500 again, its own effect.
  expect(payments.applied).toEqual([
    { order: 'o-1', amountCents: 500 },
    { order: 'o-1', amountCents: 700 },
    { order: 'o-1', amountCents: 500 },
  ]);
  expect(await ledger(jobId)).toHaveLength(3);
  const published = (await harness.firestore.db.doc(`jobs/${jobId}/results/final`).get()).get('markdown') as string;
  expect(published).toBe('Done: Refunded: R-1, Refunded: R-1, Refunded: R-2\nDone: Refunded: R-3');
});

test('bug 44: a call under an identity already recorded with other arguments is refused with a tool error naming the recorded call; nothing is applied or changed', async () => {
  let refusal: string | undefined;
  script = (thread) => {
    const shown = results(thread, 'refund_order');
    if (shown.length === 0) return call('refund_order', { order: 'o-1', amountCents: 500 });
    if (shown.length === 1) {
      // Any later write to the recorded entry would carry a later time.
      harness.clock.advance(1_000);
      return call('refund_order', { order: 'o-1', amountCents: 900 });
    }
    refusal = shown[1]?.text;
    return { text: 'Done.' };
  };
  const jobId = await harness.submit('refunds', { sections: ['s1'] });
  await harness.drain();

  expect(await harness.readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  // The model read a refusal naming the conflict and the recorded call, not the first refund reported as its own.
  expect(readable(refusal)).toEqual({
    error: expect.stringMatching(/^Refused: this call applied nothing\. Its effect \(refund:o-1\) was already recorded by a refund_order call with other arguments.* The recorded call was applied: Refunded: R-1\./) as string,
    recordedArguments: { amountCents: 500, order: 'o-1' },
    recordedState: 'applied',
    recordedResult: 'Refunded: R-1',
  });
  // Only the first call was applied, and its entry is as that call left it.
  expect(payments.applied).toEqual([{ order: 'o-1', amountCents: 500 }]);
  const entries = await ledger(jobId);
  expect(entries).toEqual([
    expect.objectContaining({
      state: 'applied',
      attempts: 1,
      lookups: 0,
      intent: expect.objectContaining({ identity: 'refund:o-1', payload: { tool: 'refund_order', arguments: '{"amountCents":500,"order":"o-1"}' } }) as unknown,
      evidence: { refundId: 'R-1', replay: false },
      updatedAtMs: payments.appliedAtMs,
    }),
  ]);
});

test('an effect planned before arguments were recorded with sorted keys (in flight across that deploy) is the same effect: looked up and found, neither refused nor applied again', async () => {
  const jobId = await harness.submit('refunds', { sections: ['s1'] });
  // Recorded by the earlier revision, its arguments in the model's own key order; its apply's answer was lost.
  const key = await seedEntry(jobId, { ...REFUND_O1_500, payload: { tool: 'refund_order', arguments: '{"order":"o-1","amountCents":500}' } }, 'unknown');
  payments.refunds.set(key, { order: 'o-1', amountCents: 500, refundId: 'R-7' });
  let answer: string | undefined;
  script = (thread) => {
    const shown = results(thread, 'refund_order');
    if (shown.length === 0) return call('refund_order', { amountCents: 500, order: 'o-1' });
    answer = shown[0]?.text;
    return { text: 'Done.' };
  };
  await harness.drain();

  expect(await harness.readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  expect(answer).toBe('Refunded: R-7');
  expect(payments.applied).toEqual([]);
  expect(await ledger(jobId)).toEqual([expect.objectContaining({ key, state: 'applied', evidence: { refundId: 'R-7' } })]);
});

test('bug 47: a refund applied with its answer lost, whose lookup then fails, is retried cold; the clean thread rewords it and is refused only once the recorded refund is reconciled, told what it did', async () => {
  const realRefund = payments.refund.bind(payments);
  const realLookup = payments.lookup.bind(payments);
  let lostAnswers = 1;
  let failedLookups = 1;
  payments.refund = async (request, key) => {
    const outcome = await realRefund(request, key);
    // Applied at the payments system; the answer never arrives.
    if (lostAnswers-- > 0) throw new Error('socket hang up');
    return outcome;
  };
  payments.lookup = async (key) => {
    // The lookup that follows the lost answer fails: the attempt fails, and the section is retried on a clean thread.
    if (failedLookups-- > 0) throw new Error('lookup: 503 from the payments API');
    return realLookup(key);
  };
  let answer: string | undefined;
  script = (thread) => {
    const shown = results(thread, 'refund_order');
    // The clean thread words the same refund anew (another amount): the same identity, other arguments.
    if (shown.length === 0) return call('refund_order', { order: 'o-1', amountCents: thread.generation === 0 ? 500 : 450 });
    answer = shown[0]?.text;
    return { text: 'Done.' };
  };
  const jobId = await harness.submit('refunds', { sections: ['s1'] });
  await harness.drain();

  // The recorded refund was looked up and found (not sent again), and the job could finish.
  expect(payments.applied).toEqual([{ order: 'o-1', amountCents: 500 }]);
  expect(await ledger(jobId)).toEqual([expect.objectContaining({ state: 'applied', reconciled: true, attempts: 1, evidence: { refundId: 'R-1' } })]);
  expect(await harness.readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  // The clean thread's model read that its call applied nothing, and what the recorded call did.
  expect(readable(answer)).toEqual({
    error: expect.stringMatching(/^Refused: this call applied nothing\..* The recorded call was applied: Refunded: R-1\./) as string,
    recordedArguments: { amountCents: 500, order: 'o-1' },
    recordedState: 'applied',
    recordedResult: 'Refunded: R-1',
  });
});

test('bug 47: a call refused for a conflict with an entry whose outcome is unknown reconciles that entry first (found: applied), then tells the model what the recorded call did', async () => {
  const jobId = await harness.submit('refunds', { sections: ['s1'] });
  // What an earlier thread of this job left: refund_order o-1 500 sent, its answer lost. The refund was made.
  const key = await seedEntry(jobId, REFUND_O1_500, 'unknown');
  payments.refunds.set(key, { order: 'o-1', amountCents: 500, refundId: 'R-7' });
  let answer: string | undefined;
  script = (thread) => {
    const shown = results(thread, 'refund_order');
    if (shown.length === 0) return call('refund_order', { order: 'o-1', amountCents: 450 });
    answer = shown[0]?.text;
    return { text: 'Done.' };
  };
  await harness.drain();

  expect(await ledger(jobId)).toEqual([expect.objectContaining({ key, state: 'applied', lookups: 1, reconciled: true, evidence: { refundId: 'R-7' } })]);
  expect(payments.applied).toEqual([]);
  expect(await harness.readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  expect(readable(answer)).toMatchObject({ recordedState: 'applied', recordedResult: 'Refunded: R-7' });
});

test('bug 47: a call refused for a conflict with an entry still planned (never sent) sends the recorded refund under its recorded arguments first, then refuses', async () => {
  const jobId = await harness.submit('refunds', { sections: ['s1'] });
  await seedEntry(jobId, REFUND_O1_500, 'planned');
  let answer: string | undefined;
  script = (thread) => {
    const shown = results(thread, 'refund_order');
    if (shown.length === 0) return call('refund_order', { order: 'o-1', amountCents: 450 });
    answer = shown[0]?.text;
    return { text: 'Done.' };
  };
  await harness.drain();

  // The recorded refund (500), not the refused call's (450).
  expect(payments.applied).toEqual([{ order: 'o-1', amountCents: 500 }]);
  expect(await ledger(jobId)).toEqual([expect.objectContaining({ state: 'applied', attempts: 1, evidence: { refundId: 'R-1', replay: false } })]);
  expect(await harness.readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  expect(readable(answer)).toMatchObject({ recordedArguments: { amountCents: 500, order: 'o-1' }, recordedState: 'applied', recordedResult: 'Refunded: R-1' });
});

test('bug 47: a call refused for a conflict with an unknown entry whose target cannot be asked waits, the call left open; once the lookup answers, it is refused', async () => {
  const jobId = await harness.submit('refunds', { sections: ['s1'] });
  const key = await seedEntry(jobId, REFUND_O1_500, 'unknown');
  payments.refunds.set(key, { order: 'o-1', amountCents: 500, refundId: 'R-7' });
  const realLookup = payments.lookup.bind(payments);
  payments.lookup = () => Promise.resolve({ kind: 'unreachable', reason: 'the payments API is down' });
  let answer: string | undefined;
  script = (thread) => {
    const shown = results(thread, 'refund_order');
    if (shown.length === 0) return call('refund_order', { order: 'o-1', amountCents: 450 });
    answer = shown[0]?.text;
    return { text: 'Done.' };
  };
  await harness.drain();

  // Not refused while the recorded refund's outcome is unknown: the job waits for the lookup.
  expect(await harness.readJob(jobId)).toMatchObject({ status: 'waiting' });
  expect(answer).toBeUndefined();
  expect(await ledger(jobId)).toEqual([expect.objectContaining({ state: 'unknown' })]);

  // The lookup answers again; the sweeper resumes the job when its wait is over.
  payments.lookup = realLookup;
  harness.clock.advance(61_000);
  await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  await harness.drain();
  expect(await harness.readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  expect(readable(answer)).toMatchObject({ recordedState: 'applied', recordedResult: 'Refunded: R-7' });
  expect(payments.applied).toEqual([]);
});

test('bug 48: two phases whose sections share an ID each make the same refund call without identity: two effects, each applied and reported as its own', async () => {
  const told: string[] = [];
  script = (thread) => {
    const shown = results(thread, 'refund');
    if (shown.length === 0) return call('refund', { order: 'o-1', amountCents: 500 });
    told.push(`${thread.phase}: ${shown[0]?.text ?? ''}`);
    return { text: 'Done.' };
  };
  const jobId = await harness.submit('two-rounds', { sections: ['s1'] });
  await harness.drain();

  expect(await harness.readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  expect(told).toEqual(['sections: Refunded: R-1', 'follow-up: Refunded: R-2']);
  expect(payments.applied).toEqual([{ order: 'o-1', amountCents: 500 }, { order: 'o-1', amountCents: 500 }]);
  expect(await ledger(jobId)).toHaveLength(2);
});

describe('an effect recorded under the call-ID key of the revisions before arguments keyed it (in flight across that deploy)', () => {
  /** What such a revision recorded for refund o-1 500 made as call-1 in section s1's first thread: the arguments as the model wrote them. */
  const before: EffectIntent = { kind: 'tool-refund', identity: 's1/g0/call-1', target: 'the test payments', payload: { tool: 'refund', arguments: '{"order":"o-1","amountCents":500}' } };
  const sameCall = (answers: (string | undefined)[]) => (thread: Thread) => {
    const shown = results(thread, 'refund');
    if (shown.length === 0) return call('refund', { order: 'o-1', amountCents: 500 });
    answers.push(shown[0]?.text);
    return { text: 'Done.' };
  };

  test('unknown: the same call is looked up under the old key and found; nothing applied, no entry under the new key', async () => {
    const jobId = await harness.submit('refunds', { sections: ['s1'] });
    const key = await seedEntry(jobId, before, 'unknown');
    payments.refunds.set(key, { order: 'o-1', amountCents: 500, refundId: 'R-7' });
    const answers: (string | undefined)[] = [];
    script = sameCall(answers);
    await harness.drain();

    expect(await harness.readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
    expect(answers).toEqual(['Refunded: R-7']);
    expect(payments.applied).toEqual([]);
    expect(await ledger(jobId)).toEqual([expect.objectContaining({ key, state: 'applied', evidence: { refundId: 'R-7' } })]);
  });

  test('applied (its result not yet in the transcript): the same call is answered with the recorded result; nothing applied again', async () => {
    const jobId = await harness.submit('refunds', { sections: ['s1'] });
    const key = await seedEntry(jobId, before, 'applied', { refundId: 'R-5' });
    const answers: (string | undefined)[] = [];
    script = sameCall(answers);
    await harness.drain();

    expect(await harness.readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
    expect(answers).toEqual(['Refunded: R-5']);
    expect(payments.applied).toEqual([]);
    expect(await ledger(jobId)).toEqual([expect.objectContaining({ key, state: 'applied', evidence: { refundId: 'R-5' } })]);
  });
});
