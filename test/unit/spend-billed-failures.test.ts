/**
 * Model answers the OpenAI-compatible client refuses after the provider billed them (no content
 * and no tool calls, a content filter stop, a streamed tool call without its ID) still count
 * against the owner's daily spend: the refusal carries the cost, and the section runner charges it
 * as it does any answer it throws away. A local HTTP server plays the provider.
 */
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { ToolCall } from '../../functions/src/agent/provider';
import { runSection, type SectionDeps, type StoredTranscript } from '../../functions/src/agent/section-runner';
import type { Toolbox } from '../../functions/src/agent/tools';
import { ManualClock } from '../../functions/src/core/clock';
import { createOpenAiCompatibleProvider } from '../../functions/src/providers/openai-compatible';
import { failureOf } from '../support/failures';

let server: Server;
let baseUrl = '';
/** The bodies the server answers with, in order: JSON objects, server-sent event text, or a writer of its own. */
let answers: (object | string | ((response: ServerResponse) => void))[] = [];
/** The request bodies the server received, as text. */
const requestBodies: string[] = [];

beforeAll(async () => {
  server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      requestBodies.push(Buffer.concat(chunks).toString('utf8'));
      const answer = answers.shift();
      if (typeof answer === 'function') answer(response);
      else if (typeof answer === 'string') response.writeHead(200, { 'content-type': 'text/event-stream' }).end(answer);
      else response.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(answer));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

const USAGE = { prompt_tokens: 40_000, completion_tokens: 10 };
const PER_CALL_USD = (USAGE.prompt_tokens / 1000) * 0.5 + (USAGE.completion_tokens / 1000) * 2;
const completion = (message: Record<string, unknown>, finishReason = 'stop') => ({
  id: 'c',
  object: 'chat.completion',
  choices: [{ index: 0, message: { role: 'assistant', ...message }, finish_reason: finishReason }],
  usage: USAGE,
});
const events = (...chunks: object[]): string => `${chunks.map((chunk) => `data: ${JSON.stringify(chunk)}\n\n`).join('')}data: [DONE]\n\n`;

/** One section over the provider at the local server, every charge recorded in `charged`. */
function section(charged: number[], deps: Partial<SectionDeps> = {}): ReturnType<typeof runSection> {
  const clock = new ManualClock(Date.UTC(2026, 11, 1, 12));
  const provider = createOpenAiCompatibleProvider(
    { baseUrl, model: 'm', timeoutMs: 5_000, contextWindowTokens: 128_000, inputUsdPer1kTokens: 0.5, outputUsdPer1kTokens: 2 },
    { clock },
  );
  const toolbox: Toolbox = { specs: [], execute: (_call: ToolCall) => Promise.reject(new Error('no tools here')) };
  let stored: StoredTranscript | null = null;
  return runSection(
    { sectionId: 's', promptId: 'p', system: 'sys', prompt: 'Write.', coldContext: '', maxToolRounds: 2 },
    {
      provider,
      toolbox,
      signal: new AbortController().signal,
      transcripts: { load: () => Promise.resolve(stored), save: (_id, transcript) => Promise.resolve(void (stored = transcript)) },
      policy: { warmRetries: 2, coldRetries: 0 },
      spend: { beforeCall: () => Promise.resolve(), charge: (usd) => void charged.push(usd) },
      ...deps,
    },
  );
}

async function chargesOf(streaming: boolean, charged: number[] = []): Promise<{ charged: number[]; outcome: string; wastedUsd: number }> {
  const outcome = await section(charged, streaming ? { onDraft: () => undefined } : {});
  return { charged, outcome: outcome.kind, wastedUsd: outcome.tally.wastedUsd };
}

test('two billed answers with neither content nor tool calls, then a good one: all three are charged, two as waste', async () => {
  answers = [completion({ content: null }), completion({ content: null }), completion({ content: 'The answer.' })];
  const { charged, outcome, wastedUsd } = await chargesOf(false);
  expect(outcome).toBe('written');
  expect(charged).toHaveLength(3);
  expect(charged.reduce((sum, usd) => sum + usd, 0)).toBeCloseTo(3 * PER_CALL_USD, 9);
  expect(wastedUsd).toBeCloseTo(2 * PER_CALL_USD, 9);
});

test('an answer stopped by the content filter is charged', async () => {
  answers = [completion({ content: 'Par' }, 'content_filter')];
  const charged: number[] = [];
  // The refusal ends the section (the provider rejected the request); its cost was charged before it did.
  await expect(chargesOf(false, charged)).rejects.toThrow(/content filter stopped the answer/);
  expect(charged).toEqual([PER_CALL_USD]);
});

test('a streamed tool call that arrives without its ID is charged, then the good answer', async () => {
  const nameless = events(
    { id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { role: 'assistant', tool_calls: [{ index: 0, function: { name: '', arguments: '{}' } }] }, finish_reason: null }] },
    { id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] },
    { id: 'c', object: 'chat.completion.chunk', choices: [], usage: USAGE },
  );
  const good = events(
    { id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { role: 'assistant', content: 'Done.' }, finish_reason: null }] },
    { id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] },
    { id: 'c', object: 'chat.completion.chunk', choices: [], usage: USAGE },
  );
  answers = [nameless, good];
  const { charged, outcome } = await chargesOf(true);
  expect(outcome).toBe('written');
  expect(charged).toEqual([PER_CALL_USD, PER_CALL_USD]);
});

/** The estimate of a call cut off with no usage reported: four characters a token, the request's for input, the streamed text's for output. */
const estimatedUsd = (requestChars: number, streamedChars: number): number => (Math.ceil(requestChars / 4) / 1000) * 0.5 + (Math.ceil(streamedChars / 4) / 1000) * 2;

test("bug 37: a streamed answer cut off by a cancel (the step's abort) is charged what was streamed, at once, and once", async () => {
  const streamed = 'The owner cancels while this answer is being written. '.repeat(20);
  answers = [
    (response) => {
      response.writeHead(200, { 'content-type': 'text/event-stream' });
      response.write(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { role: 'assistant', content: streamed }, finish_reason: null }] })}\n\n`);
      // Held open: only the abort ends this call.
    },
  ];
  requestBodies.length = 0;
  const controller = new AbortController();
  const reason = new Error('cancelled by its owner');
  const charged: number[] = [];
  let chargedWhenAborted: number[] = [];
  const run = section(charged, {
    signal: controller.signal,
    onDraft: () => {
      controller.abort(reason);
      // Charged by the time the abort returns: a step that stops on the abort settles its spend after this.
      chargedWhenAborted = charged.filter((usd) => usd > 0);
    },
  });
  expect(await failureOf(run)).toBe(reason);
  const expected = estimatedUsd(requestBodies[0]?.length ?? 0, streamed.length);
  expect(expected).toBeGreaterThan(0);
  expect(chargedWhenAborted).toHaveLength(1);
  expect(chargedWhenAborted[0]).toBeCloseTo(expected, 12);
  expect(charged.filter((usd) => usd > 0)).toEqual(chargedWhenAborted);
});

test('bug 37: a stream that breaks off or times out midway is charged what was streamed, as the failed call it is', async () => {
  const streamed = 'Half an answer';
  answers = [
    (response) => {
      response.writeHead(200, { 'content-type': 'text/event-stream' });
      response.end(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { role: 'assistant', content: streamed }, finish_reason: null }] })}\n\n`);
    },
    events(
      { id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { role: 'assistant', content: 'Done.' }, finish_reason: null }] },
      { id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] },
      { id: 'c', object: 'chat.completion.chunk', choices: [], usage: USAGE },
    ),
  ];
  requestBodies.length = 0;
  const charged: number[] = [];
  const outcome = await section(charged, { onDraft: () => undefined, policy: { warmRetries: 2, coldRetries: 0, transientRetries: 1, transientMinDelayMs: 1, transientMaxDelayMs: 1 } });
  expect(outcome.kind).toBe('written');
  expect(charged).toHaveLength(2);
  expect(charged[0]).toBeCloseTo(estimatedUsd(requestBodies[0]?.length ?? 0, streamed.length), 12);
  expect(charged[1]).toBeCloseTo(PER_CALL_USD, 12);
});
