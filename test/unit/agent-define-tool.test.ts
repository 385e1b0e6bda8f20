/**
 * defineTool and createToolbox without a step: definitions checked when written, arguments parsed
 * by the tool's zod schema before `execute` sees them, text and sources passed back, and an
 * effectful tool refused outside a step (it may only run through the step's effect ledger; the
 * ledger paths themselves run on the emulator in test/emulator/triage.test.ts, and its keys in
 * test/emulator/agent-define-tool.test.ts).
 */
import { z } from 'zod';
import { createToolbox, defineTool, type ToolCall } from '../../functions/src/agent';

const signal = new AbortController().signal;
const call = (name: string, args: unknown): ToolCall => ({ id: 'c1', name, arguments: typeof args === 'string' ? args : JSON.stringify(args) });

const seen: unknown[] = [];
const double = defineTool({
  name: 'double',
  description: 'Doubles a number',
  input: z.strictObject({ value: z.number().int() }),
  execute: ({ value }) => {
    seen.push(value);
    return String(value * 2);
  },
});
const cite = defineTool({
  name: 'cite',
  description: 'Returns a passage with its source',
  input: z.object({}),
  execute: () => ({ content: 'a passage', sources: [{ url: 'https://example.org/a', title: 'A', passage: 'a passage', fetchedAt: '2026-01-01T00:00:00.000Z' }] }),
});
const send = defineTool({
  name: 'send_note',
  description: 'Sends a note',
  input: z.object({ to: z.string() }),
  effect: { lookup: () => Promise.resolve({ kind: 'not-found' as const }) },
  execute: () => Promise.resolve({ kind: 'applied' as const, evidence: {} }),
});

beforeEach(() => {
  seen.length = 0;
});

test('a toolbox offers each tool with its zod schema as JSON Schema, without the $schema key', () => {
  const [spec] = createToolbox([double]).specs;
  expect(spec).toEqual({
    name: 'double',
    description: 'Doubles a number',
    parameters: { type: 'object', properties: { value: { type: 'integer', minimum: expect.any(Number) as number, maximum: expect.any(Number) as number } }, required: ['value'], additionalProperties: false },
  });
});

test('arguments are parsed before execute: valid ones reach it, invalid or non-JSON ones come back to the model as a tool error', async () => {
  const toolbox = createToolbox([double]);
  expect(await toolbox.execute(call('double', { value: 21 }), signal)).toEqual({ ok: true, content: '42' });
  const wrongType = await toolbox.execute(call('double', { value: 'x' }), signal);
  expect(wrongType.ok).toBe(false);
  expect(wrongType.content).toContain('Invalid arguments for double');
  expect((await toolbox.execute(call('double', '{not json'), signal)).content).toContain('not valid JSON');
  expect(seen).toEqual([21]);
});

test('a call to a tool the toolbox does not have is answered with the names it does have', async () => {
  const result = await createToolbox([double, cite]).execute(call('triple', { value: 1 }), signal);
  expect(result).toEqual({ ok: false, content: JSON.stringify({ error: 'There is no tool named triple. Use one of: double, cite.' }) });
});

test('a tool that returns sources hands them on for citing', async () => {
  expect(await createToolbox([cite]).execute(call('cite', {}), signal)).toMatchObject({ ok: true, content: 'a passage', sources: [{ url: 'https://example.org/a' }] });
});

test('an effectful tool does not run outside a step: it needs the step effect ledger', async () => {
  await expect(createToolbox([send]).execute(call('send_note', { to: 'x' }), signal, { sectionId: 's', generation: 0 })).rejects.toThrow(
    'Tool send_note has an external effect: it runs only inside a step',
  );
});

test('bad definitions are refused when written, with what is wrong', () => {
  expect(() => defineTool({ name: 'has space', description: 'x', input: z.object({}), execute: () => '' })).toThrow('must be 1 to 64 letters, digits, _ or -');
  expect(() => defineTool({ name: 'quiet', description: ' ', input: z.object({}), execute: () => '' })).toThrow('Tool quiet needs a description');
  expect(() => createToolbox([double, double])).toThrow('Two tools are named double');
  const sendTwin = defineTool({
    name: 'send-note',
    description: 'Sends a note too',
    input: z.object({}),
    effect: { lookup: () => Promise.resolve({ kind: 'not-found' as const }) },
    execute: () => Promise.resolve({ kind: 'applied' as const, evidence: {} }),
  });
  expect(() => createToolbox([send, sendTwin])).toThrow('Tools send_note and send-note would record their effects under one kind');
  const noLookup = { name: 'blind', description: 'x', input: z.object({}), effect: {}, execute: () => Promise.resolve({ kind: 'applied', evidence: {} }) };
  expect(() => defineTool(noLookup as unknown as Parameters<typeof defineTool>[0])).toThrow('has an effect but no lookup');
});
