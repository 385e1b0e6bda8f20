/**
 * Recorded sources never reach a model provider as data: a section run over the OpenAI-compatible
 * provider (its fetch injected) sends the citation key in the tool message's text and no `sources`
 * field anywhere in the request body, while the saved transcript keeps them.
 */
import type { Source, ToolCall } from '../../functions/src/agent/provider';
import { runSection } from '../../functions/src/agent/section-runner';
import type { Toolbox, ToolResult } from '../../functions/src/agent/tools';
import { CITATION_KEY_HEADING } from '../../functions/src/agent/transcript';
import { createOpenAiCompatibleProvider, toWireMessages } from '../../functions/src/providers/openai-compatible';
import { keptTranscript } from '../support/transcripts';

const SOURCE: Source = { url: 'https://a.example/lease', title: 'Leases', passage: 'A lease is a lock with an expiry.', fetchedAt: '2026-01-01T00:00:00.000Z' };

function completion(message: Record<string, unknown>, finishReason: string): Response {
  const body = { choices: [{ message: { role: 'assistant', ...message }, finish_reason: finishReason }], usage: { prompt_tokens: 10, completion_tokens: 5 } };
  return new Response(JSON.stringify(body), { status: 200, headers: { 'content-type': 'application/json' } });
}

test('the OpenAI-compatible request carries the key as text and no sources field; the transcript keeps the sources', async () => {
  const bodies: string[] = [];
  const answers = [
    completion({ content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{"query":"lease"}' } }] }, 'tool_calls'),
    completion({ content: 'A lease expires [1].' }, 'stop'),
  ];
  const provider = createOpenAiCompatibleProvider(
    { baseUrl: 'http://127.0.0.1:9/v1', model: 'm', timeoutMs: 60_000, contextWindowTokens: 128_000, inputUsdPer1kTokens: 0, outputUsdPer1kTokens: 0 },
    {
      fetch: (_url, init) => {
        bodies.push(typeof init?.body === 'string' ? init.body : '');
        const next = answers.shift();
        return next === undefined ? Promise.reject(new Error('no more answers')) : Promise.resolve(next);
      },
    },
  );
  const toolbox: Toolbox = {
    specs: [{ name: 'search', description: 'search', parameters: { type: 'object' } }],
    execute: (_call: ToolCall): Promise<ToolResult> => Promise.resolve({ ok: true, content: '{"results":[]}', sources: [SOURCE] }),
  };
  const kept = keptTranscript();

  const outcome = await runSection(
    { sectionId: 's', promptId: 'p', system: 'sys', prompt: 'Write about leases.', coldContext: '', maxToolRounds: 3, sources: [{ ...SOURCE, url: 'https://b.example/' }] },
    {
      provider,
      toolbox,
      signal: new AbortController().signal,
      transcripts: kept.port,
    },
  );

  expect(outcome).toMatchObject({ kind: 'written', text: 'A lease expires [1].', sources: [{ url: 'https://b.example/', number: 1 }, { url: SOURCE.url, number: 2 }] });
  expect(bodies).toHaveLength(2);
  for (const body of bodies) expect(body).not.toMatch(/"sources"/);
  const second = JSON.parse(bodies[1] ?? '{}') as { messages: { role: string; content: string }[] };
  expect(second.messages[1]?.content).toContain(`${CITATION_KEY_HEADING}\n[1] Leases <https://b.example/>`);
  expect(second.messages.at(-1)?.content).toBe(`{"results":[]}\n\n${CITATION_KEY_HEADING}\n[2] Leases <https://a.example/lease>`);
  expect(kept.last()?.messages.at(-2)).toMatchObject({ role: 'tool', sources: [{ ...SOURCE, number: 2 }] });
});

test('toWireMessages takes only the wire fields, whatever else a message carries', () => {
  const wire = toWireMessages([
    { role: 'user', content: 'p', promptId: 'p', sources: [{ ...SOURCE, number: 1 }] },
    { role: 'tool', toolCallId: 'c1', name: 'search', content: 'r', sources: [{ ...SOURCE, number: 1 }] },
  ]);
  expect(wire).toEqual([
    { role: 'user', content: 'p' },
    { role: 'tool', tool_call_id: 'c1', content: 'r' },
  ]);
});
