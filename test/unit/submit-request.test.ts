import { z } from 'zod';
import { definePhase, definePipeline, pipelineRegistry } from '../../functions/src/core/pipeline';
import { parseIdempotencyKey, submissionValidator } from '../../functions/src/engine/submit';
import { bearerToken, checkContentType, readJsonBody, SUBMIT_BODY_LIMIT_BYTES } from '../../functions/src/http/request';

const echoInput = z.strictObject({ text: z.string().min(1).max(1000), times: z.number().int().positive().default(1) });
type EchoInput = z.infer<typeof echoInput>;

const echo = definePipeline<EchoInput>({
  name: 'echo',
  description: 'Repeats its text',
  input: echoInput,
  phases: [
    definePhase<EchoInput, { text: string }>({
      name: 'repeat',
      state: z.object({ text: z.string() }),
      run: (context) => Promise.resolve({ kind: 'done', state: { text: context.input.text.repeat(context.input.times) } }),
    }),
  ],
  publish: () => ({ outcome: 'complete', title: 'Echo', markdown: '', missing: [] }),
});
const validate = submissionValidator(pipelineRegistry(echo));

describe('bearerToken', () => {
  test.each([
    ['Bearer abc.def-ghi_jkl', 'abc.def-ghi_jkl'],
    ['bearer abc.def', 'abc.def'],
    ['  Bearer   abc.def  ', 'abc.def'],
    ['Bearer YWJj==', 'YWJj=='],
  ])('accepts %j', (header, token) => {
    expect(bearerToken(header)).toEqual({ ok: true, value: token });
  });

  test.each([
    [undefined, /Missing Authorization header/],
    ['', /Missing Authorization header/],
    ['Basic dXNlcjpwYXNz', /must use the Bearer scheme/],
    ['Token abc', /must use the Bearer scheme/],
    ['Bearer', /no token after "Bearer"/],
    ['Bearer abc def', /malformed/],
    ['Bearer a"b', /malformed/],
  ])('refuses %j with 401', (header, message) => {
    const result = bearerToken(header);
    if (result.ok) throw new Error('expected a refusal');
    expect(result.rejection.status).toBe(401);
    expect(result.rejection.message).toMatch(message);
    expect(result.rejection.headers?.['WWW-Authenticate']).toMatch(/^Bearer /);
  });
});

describe('checkContentType', () => {
  test.each(['application/json', 'Application/JSON', 'application/json; charset=utf-8', 'application/json;charset="UTF-8"'])('accepts %j', (header) => {
    expect(checkContentType(header)).toBeNull();
  });

  test.each([
    [undefined, /no Content-Type/],
    ['text/plain', /must be application\/json; got "text\/plain"/],
    ['application/x-www-form-urlencoded', /must be application\/json/],
    ['application/jsonp', /must be application\/json/],
    ['application/json; charset=latin1', /must be UTF-8 JSON/],
  ])('refuses %j with 415', (header, message) => {
    const refusal = checkContentType(header);
    expect(refusal?.status).toBe(415);
    expect(refusal?.message).toMatch(message);
  });
});

describe('readJsonBody', () => {
  const raw = (text: string) => ({ rawBody: Buffer.from(text, 'utf8') });

  test('parses the raw bytes, ignoring what the framework parsed', () => {
    expect(readJsonBody({ rawBody: Buffer.from('{"a":1}'), body: { b: 2 } })).toEqual({ ok: true, value: { a: 1 } });
  });

  test('falls back to a parsed body, a string body or a buffer body', () => {
    expect(readJsonBody({ body: { a: 1 } })).toEqual({ ok: true, value: { a: 1 } });
    expect(readJsonBody({ body: '[1]' })).toEqual({ ok: true, value: [1] });
    expect(readJsonBody({ body: Buffer.from('"x"') })).toEqual({ ok: true, value: 'x' });
  });

  test.each([
    [raw('{"pipeline":'), 400, /not valid JSON/],
    [raw("{'a': 1}"), 400, /not valid JSON/],
    [raw(''), 400, /body is empty/],
    [raw('   \n'), 400, /body is empty/],
    [{}, 400, /body is empty/],
    [{ rawBody: Buffer.from([0x7b, 0xff, 0x7d]) }, 400, /not valid UTF-8/],
    [{ body: '{nope' }, 400, /not valid JSON/],
  ])('refuses %#', (request, status, message) => {
    const result = readJsonBody(request);
    if (result.ok) throw new Error('expected a refusal');
    expect(result.rejection.status).toBe(status);
    expect(result.rejection.message).toMatch(message);
  });

  test('bug 32: refuses a lone surrogate anywhere in the body, values and field names, naming where it is', () => {
    const refused = (body: unknown) => {
      const result = readJsonBody(raw(JSON.stringify(body)));
      if (result.ok) throw new Error('expected a refusal');
      expect(result.rejection).toMatchObject({ status: 400, error: 'invalid_text' });
      return result.rejection.message;
    };
    expect(refused({ input: { recipients: [{ name: 'ok' }, { name: 'Ann \ud800' }] } })).toMatch(/at input\.recipients\[1\]\.name/);
    expect(refused({ input: { ['\udc00']: 1 } })).toMatch(/a field name in input/);
    expect(refused('\ud800')).toMatch(/the body/);
    // What the framework parsed is held to the same rule.
    expect(readJsonBody({ body: { reason: '\ud800' } })).toMatchObject({ ok: false, rejection: { status: 400, error: 'invalid_text' } });
  });

  test('accepts paired surrogates, and walks a deeply nested body without running out of stack', () => {
    expect(readJsonBody(raw(JSON.stringify({ text: '\ud83d\ude80' })))).toEqual({ ok: true, value: { text: '\ud83d\ude80' } });
    const deep = `${'['.repeat(30_000)}"x"${']'.repeat(30_000)}`;
    expect(readJsonBody(raw(deep)).ok).toBe(true);
    expect(readJsonBody(raw(`${'['.repeat(30_000)}"\\ud800"${']'.repeat(30_000)}`))).toMatchObject({ ok: false, rejection: { status: 400 } });
  });

  test('measures the raw bytes against the limit, to the byte', () => {
    const exact = `"${'a'.repeat(SUBMIT_BODY_LIMIT_BYTES - 2)}"`;
    expect(readJsonBody(raw(exact)).ok).toBe(true);
    const over = readJsonBody(raw(`${exact} `));
    if (over.ok) throw new Error('expected a refusal');
    expect(over.rejection).toMatchObject({ status: 413, message: expect.stringMatching(/65537 bytes; the limit is 65536 bytes \(64 KiB\)/) as unknown });
  });

  test('counts UTF-8 bytes, not characters', () => {
    const text = `"${'é'.repeat(SUBMIT_BODY_LIMIT_BYTES / 2)}"`; // 2 bytes each: over the limit, though under it in characters
    expect(readJsonBody(raw(text))).toMatchObject({ ok: false, rejection: { status: 413 } });
  });

  test('measures a parsed body by its serialized size', () => {
    expect(readJsonBody({ body: { text: 'a'.repeat(SUBMIT_BODY_LIMIT_BYTES) } })).toMatchObject({ ok: false, rejection: { status: 413 } });
    expect(readJsonBody({ body: { text: 'a'.repeat(1000) } }).ok).toBe(true);
  });
});

describe('parseIdempotencyKey', () => {
  test('absent means no key', () => {
    expect(parseIdempotencyKey(undefined)).toEqual({ ok: true, value: null });
  });

  test.each(['k', 'order-42/attempt 1', '~'.repeat(200)])('accepts %j', (key) => {
    expect(parseIdempotencyKey(key)).toEqual({ ok: true, value: key });
  });

  test.each([
    ['', /it is empty/],
    ['x'.repeat(201), /it is 201 characters long/],
    ['clé', /outside printable ASCII/],
    ['tab\there', /outside printable ASCII/],
  ])('refuses %j', (key, message) => {
    const result = parseIdempotencyKey(key);
    if (result.ok) throw new Error('expected a refusal');
    expect(result.message).toMatch(/^Idempotency-Key must be 1 to 200 printable ASCII characters/);
    expect(result.message).toMatch(message);
  });
});

describe('submissionValidator', () => {
  test('returns the pipeline schema output (defaults applied) and a null conversation', () => {
    expect(validate({ pipeline: 'echo', input: { text: 'hi' } })).toEqual({
      ok: true,
      value: { pipeline: 'echo', input: { text: 'hi', times: 1 }, conversationId: null, pipelineVersion: 1 },
    });
    expect(validate({ pipeline: 'echo', input: { text: 'hi', times: 2 }, conversationId: 'conv_1-A' })).toEqual({
      ok: true,
      value: { pipeline: 'echo', input: { text: 'hi', times: 2 }, conversationId: 'conv_1-A', pipelineVersion: 1 },
    });
  });

  test.each([
    [[], /must be a JSON object.*got an array/],
    [null, /must be a JSON object.*got null/],
    ['echo', /must be a JSON object.*got a string/],
    [{}, /pipeline is required.*known pipelines: "echo"/s],
    [{ pipeline: '', input: {} }, /pipeline must not be empty/],
    [{ pipeline: 'echo' }, /input is required[\s\S]*→ at input/],
    [{ pipeline: 'nope', input: {} }, /^Unknown pipeline "nope" \(known pipelines: "echo"\)$/],
    [{ pipeline: 'echo', input: 'hi' }, /Invalid input for pipeline "echo"[\s\S]*expected object, received string[\s\S]*→ at input$/],
    [{ pipeline: 'echo', input: { text: '' } }, /too small[\s\S]*→ at input\.text/i],
    [{ pipeline: 'echo', input: { text: 'hi', times: 0 } }, /→ at input\.times/],
    [{ pipeline: 'echo', input: { text: 'hi', colour: 'red' } }, /Unrecognized key: "colour"[\s\S]*→ at input/],
    [{ pipeline: 'echo', input: { text: 'hi' }, priority: 1 }, /Unrecognized key: "priority"/],
    [{ pipeline: 'echo', input: { text: 'hi' }, conversationId: 'a/b' }, /conversationId must be 1 to 128 letters[\s\S]*→ at conversationId/],
    [{ pipeline: 'echo', input: { text: 'hi' }, conversationId: 'x'.repeat(129) }, /conversationId must be 1 to 128/],
    [{ pipeline: 'echo', input: { text: 'hi' }, conversationId: '__meta__' }, /reserved by Firestore/],
    [{ pipeline: 'echo', input: { text: 'hi' }, conversationId: 7 }, /conversationId must be a string/],
  ])('refuses %j', (body, message) => {
    const result = validate(body);
    if (result.ok) throw new Error('expected a refusal');
    expect(result.message).toMatch(message);
  });

  test('an empty registry says so', () => {
    const result = submissionValidator(new Map())({ pipeline: 'echo', input: {} });
    expect(result).toEqual({ ok: false, message: 'Unknown pipeline "echo" (known pipelines: none are registered)' });
  });
});
