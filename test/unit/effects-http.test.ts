/** The HTTP adapter against the local receiver: loopback HTTP only, no emulator. */
import { createHttpEffectAdapter } from '../../functions/src/effects/http-adapter';
import type { EffectIntent } from '../../functions/src/effects/ledger';
import type { EffectAdapter } from '../../functions/src/effects/port';
import { httpAdapter, startReceiver, TEST_HTTP_TIMEOUT_MS, type Receiver } from '../support/receiver';

let receiver: Receiver;
let adapter: EffectAdapter;
beforeEach(async () => {
  receiver = await startReceiver();
  adapter = httpAdapter(receiver);
});
afterEach(() => receiver.stop());

const signal = () => new AbortController().signal;
const intent: EffectIntent = { kind: 'message', identity: 'renewal/c001', target: 'a@example.test', payload: { subject: 'Hello', body: 'Hi' } };
const KEY = 'fx_0000000000000000000000000000000000000001';

test('the key travels as Idempotency-Key; the same key is applied once and replayed with the stored result', async () => {
  const first = await adapter.apply(intent, KEY, signal());
  expect(first).toMatchObject({ kind: 'applied', evidence: { effectId: 'rcv-000001', replayed: false, status: 201 } });
  // The same request again, with its fields in another order (as the ledger may store them).
  const reordered: EffectIntent = { payload: { body: 'Hi', subject: 'Hello' }, target: intent.target, identity: intent.identity, kind: intent.kind };
  const second = await adapter.apply(reordered, KEY, signal());
  expect(second).toMatchObject({ kind: 'applied', evidence: { effectId: 'rcv-000001', replayed: true, status: 200 } });
  expect(receiver.applied()).toHaveLength(1);
  expect(receiver.requests.map((request) => [request.op, request.key, request.outcome])).toEqual([
    ['apply', KEY, 201],
    ['apply', KEY, 200],
  ]);
  expect(await adapter.lookup(KEY, signal())).toMatchObject({ kind: 'found', evidence: { effectId: 'rcv-000001' } });
  expect(await adapter.lookup('fx_nothing-here', signal())).toEqual({ kind: 'not-found' });
});

test('the same key for a different request is refused for good, and applies nothing', async () => {
  await adapter.apply(intent, KEY, signal());
  const outcome = await adapter.apply({ ...intent, payload: { subject: 'Other', body: 'Hi' } }, KEY, signal());
  expect(outcome).toMatchObject({ kind: 'rejected', reason: expect.stringContaining('422') as unknown });
  expect(receiver.applied()).toHaveLength(1);
});

test('applied, then no answer: the client times out not knowing, and a lookup finds it', async () => {
  receiver.inject({ op: 'apply', mode: 'apply-then-hang', times: 1 });
  const outcome = await adapter.apply(intent, KEY, signal());
  expect(outcome).toMatchObject({ kind: 'unknown', reason: expect.stringContaining(`${TEST_HTTP_TIMEOUT_MS} ms`) as unknown });
  expect(receiver.applied()).toHaveLength(1);
  expect((await adapter.lookup(KEY, signal())).kind).toBe('found');
});

test('a failure before applying is an unknown outcome to the client; the lookup shows nothing was applied', async () => {
  receiver.inject({ op: 'apply', mode: 'fail-before-apply', times: 1 });
  expect(await adapter.apply(intent, KEY, signal())).toMatchObject({ kind: 'unknown', reason: expect.stringContaining('500') as unknown });
  expect(await adapter.lookup(KEY, signal())).toEqual({ kind: 'not-found' });
  expect((await adapter.apply(intent, KEY, signal())).kind).toBe('applied');
  expect(receiver.applied()).toHaveLength(1);
});

test('a dropped connection is an unknown outcome', async () => {
  receiver.inject({ op: 'apply', mode: 'drop-connection', times: 1 });
  expect((await adapter.apply(intent, KEY, signal())).kind).toBe('unknown');
  expect(receiver.applied()).toHaveLength(0);
});

test('unavailable (503): provably not applied, with Retry-After; lookups cannot tell', async () => {
  await receiver.setAvailability('unavailable');
  expect(await adapter.apply(intent, KEY, signal())).toMatchObject({ kind: 'unavailable', retryAfterMs: 1_000 });
  expect((await adapter.lookup(KEY, signal())).kind).toBe('unreachable');
  expect(receiver.applied()).toHaveLength(0);
  await receiver.setAvailability('up');
  expect((await adapter.apply(intent, KEY, signal())).kind).toBe('applied');
});

test('refused (not listening): nothing was sent; it comes back on the same address', async () => {
  await receiver.setAvailability('refused');
  expect(await adapter.apply(intent, KEY, signal())).toMatchObject({ kind: 'unavailable', reason: expect.stringContaining('ECONNREFUSED') as unknown });
  expect(await adapter.lookup(KEY, signal())).toMatchObject({ kind: 'unreachable', reason: expect.stringContaining('ECONNREFUSED') as unknown });
  await receiver.setAvailability('up');
  expect((await adapter.apply(intent, KEY, signal())).kind).toBe('applied');
  expect(receiver.applied()).toHaveLength(1);
});

test('lookup faults: a hanging or failing lookup cannot tell', async () => {
  await adapter.apply(intent, KEY, signal());
  receiver.inject({ op: 'lookup', mode: 'apply-then-hang', times: 1 });
  receiver.inject({ op: 'lookup', mode: 'fail-before-apply', times: 1 });
  expect(await adapter.lookup(KEY, signal())).toMatchObject({ kind: 'unreachable', reason: expect.stringContaining('within') as unknown });
  expect(await adapter.lookup(KEY, signal())).toMatchObject({ kind: 'unreachable', reason: expect.stringContaining('500') as unknown });
  expect((await adapter.lookup(KEY, signal())).kind).toBe('found');
});

test("the caller's abort (a lost claim) is thrown, not mistaken for an outcome", async () => {
  receiver.inject({ op: 'apply', mode: 'apply-then-hang', times: 1 });
  const controller = new AbortController();
  const slow = createHttpEffectAdapter({ baseUrl: receiver.url, timeoutMs: 10_000 });
  const pending = slow.apply(intent, KEY, controller.signal);
  controller.abort(new Error('claim lost'));
  await expect(pending).rejects.toThrow('claim lost');
});

test('requests without a key or an intent are refused; the control endpoint switches availability and faults', async () => {
  const bare = await fetch(`${receiver.url}/effects`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ intent }) });
  expect(bare.status).toBe(400);
  const noIntent = await fetch(`${receiver.url}/effects`, { method: 'POST', headers: { 'idempotency-key': KEY }, body: '{}' });
  expect(noIntent.status).toBe(400);

  const control = (body: unknown) => fetch(`${receiver.url}/control`, { method: 'POST', body: JSON.stringify(body) });
  expect((await control({ availability: 'unavailable' })).status).toBe(200);
  expect(await (await fetch(`${receiver.url}/health`)).json()).toMatchObject({ availability: 'unavailable' });
  expect((await control({ availability: 'up', faults: [{ op: 'apply', mode: 'fail-before-apply', times: 1 }] })).status).toBe(200);
  expect((await adapter.apply(intent, KEY, signal())).kind).toBe('unknown');
  expect((await adapter.apply(intent, KEY, signal())).kind).toBe('applied');
  const listed = (await (await fetch(`${receiver.url}/applications`)).json()) as { applications: { key: string }[] };
  expect(listed.applications.map((application) => application.key)).toEqual([KEY]);
});
