import { ManualClock } from '../../functions/src/core/clock';
import { canonicalJson, deriveEffectKey, intentFingerprint } from '../../functions/src/core/effect-keys';
import {
  applyChange,
  DEFAULT_IN_FLIGHT_GRACE_MS,
  effectEntrySchema,
  EffectStateConflictError,
  IN_FLIGHT_MARGIN_MS,
  type EffectChange,
  type EffectEntry,
  type EffectIntent,
  type EffectLedger,
  type EffectState,
} from '../../functions/src/effects/ledger';
import type { ApplyOutcome, EffectAdapter, LookupOutcome } from '../../functions/src/effects/port';
import { settleEffect, type SettleOptions } from '../../functions/src/effects/protocol';
import { decideReconcile, type ReconcileDecision, type UnknownAnswer } from '../../functions/src/effects/reconcile';
import { classifyApplyResponse, classifyLookupResponse, classifyTransportError, createHttpEffectAdapter } from '../../functions/src/effects/http-adapter';
import { buildPlan, countItems, countItemsFromLedger, itemStatus, notifyDepsFromEnv, notifyInput, notifyStoppedEffects, render } from '../../functions/src/pipelines/notify';
import { DEFAULT_SETTLE_GRACE_MS, MAX_SETTLE_RECHECK_MS, settleRecheckAtMs } from '../../functions/src/effects/after-stop';
import { cancellationReport, stoppedEffectsSentence } from '../../functions/src/effects/stop-report';
import { TerminalError } from '../../functions/src/core/errors';

const intent: EffectIntent = { kind: 'message', identity: 'renewal/c001', target: 'a@example.test', payload: { subject: 'Hello', body: 'Hi' } };

describe('effect keys', () => {
  test('are deterministic, shaped as a Firestore ID and an Idempotency-Key, and pinned across releases', () => {
    const key = deriveEffectKey('job-1', null, intent);
    expect(key).toBe(deriveEffectKey('job-1', null, { ...intent }));
    expect(key).toMatch(/^fx_[0-9a-f]{40}$/);
    // A changed derivation would give in-flight effects new keys on deploy: a second send. Pinned on purpose.
    expect(key).toBe('fx_eff85a2665b65045dca468ae52dfc4618aafb02e');
  });

  test('do not depend on time, attempt or process: the same effect gets the same key whenever it is derived', () => {
    const first = deriveEffectKey('job-1', 'unit-a', intent);
    jest.useFakeTimers();
    try {
      jest.setSystemTime(new Date('2031-05-05T00:00:00Z'));
      expect(deriveEffectKey('job-1', 'unit-a', intent)).toBe(first);
    } finally {
      jest.useRealTimers();
    }
    // Nothing but job, unit, kind and identity goes in: not the wording, not the target.
    const reworded: EffectIntent = { ...intent, payload: { subject: 'Other words', body: '!' }, target: 'b@example.test' };
    expect(deriveEffectKey('job-1', 'unit-a', reworded)).toBe(first);
  });

  test.each([
    ['another job', 'job-2', null, intent],
    ['a unit', 'job-1', 'unit-a', intent],
    ['another kind', 'job-1', null, { ...intent, kind: 'record' }],
    ['another identity', 'job-1', null, { ...intent, identity: 'renewal/c002' }],
  ] as const)('differ for %s', (_, jobId, unit, other) => {
    expect(deriveEffectKey(jobId, unit, other)).not.toBe(deriveEffectKey('job-1', null, intent));
  });

  test('a unit named "null" and no unit are different effects', () => {
    expect(deriveEffectKey('job-1', 'null', intent)).not.toBe(deriveEffectKey('job-1', null, intent));
  });

  test('intent fingerprints ignore key order (Firestore reorders map keys) and notice any change', () => {
    const reordered: EffectIntent = { payload: { body: 'Hi', subject: 'Hello' }, target: intent.target, identity: intent.identity, kind: intent.kind };
    expect(intentFingerprint(reordered)).toBe(intentFingerprint(intent));
    expect(canonicalJson(reordered)).toBe(canonicalJson(intent));
    expect(intentFingerprint({ ...intent, payload: { ...intent.payload, body: 'Hi!' } })).not.toBe(intentFingerprint(intent));
  });
});

describe('the notify plan', () => {
  const input = notifyInput.parse({ campaign: 'Renewal', recipients: 3 });

  test('planning twice gives the same artifact and the same keys; another job gets other keys', () => {
    const plan = buildPlan('job-1', input);
    expect(buildPlan('job-1', input)).toEqual(plan);
    expect(plan.messages.map((message) => message.recipient.id)).toEqual(['c001', 'c002', 'c003']);
    expect(plan.messages[0]?.body).toBe('Hi Customer 001, this is a reminder about Renewal.');
    const other = buildPlan('job-2', input);
    expect(other.messages.map((message) => message.sendKey)).not.toContain(plan.messages[0]?.sendKey);
    expect(new Set(plan.messages.flatMap((message) => [message.sendKey, message.recordKey])).size).toBe(6);
  });

  test('a reworded template keeps every key: the same message to the same person is the same effect', () => {
    const reworded = buildPlan('job-1', notifyInput.parse({ campaign: 'Renewal', recipients: 3, template: 'Dear {name}, {campaign} is due.' }));
    expect(reworded.messages.map((message) => message.sendKey)).toEqual(buildPlan('job-1', input).messages.map((message) => message.sendKey));
  });

  test.each([
    [{ campaign: 'x', recipients: 0 }],
    [{ campaign: 'x', recipients: 501 }],
    [{ campaign: 'x', recipients: 2.5 }],
    [{ campaign: '', recipients: 3 }],
    [{ campaign: 'x', recipients: [{ id: 'a', name: 'A', address: 'a@x' }, { id: 'a', name: 'B', address: 'b@x' }] }],
    [{ campaign: 'x', recipients: 3, receiverUrl: 'http://169.254.169.254/' }],
  ])('refuses input %j', (value) => {
    expect(notifyInput.safeParse(value).success).toBe(false);
  });

  test('templates fill known fields and leave other braces alone', () => {
    expect(render('{name} {campaign} {id} {address} {other}', 'C', { id: 'i', name: 'N', address: 'A' })).toBe('N C i A {other}');
  });
});

describe('reconcile decisions', () => {
  const found: LookupOutcome = { kind: 'found', evidence: { effectId: 'r1' } };
  const notFound: LookupOutcome = { kind: 'not-found' };
  const unreachable: LookupOutcome = { kind: 'unreachable', reason: 'connection refused' };

  test.each<[string, LookupOutcome, UnknownAnswer | null, number, ReconcileDecision['action']]>([
    ['found, nobody asked', found, null, 1, 'record-applied'],
    ['found, the owner said stop', found, 'stop', 1, 'record-applied'],
    ['found, the owner said mark not applied', found, 'mark-not-applied', 1, 'record-applied'],
    ['not found', notFound, null, 1, 'retry'],
    ['not found, too many unknowns', notFound, null, 5, 'record-not-applied'],
    ['not found, the owner said retry', notFound, 'retry', 9, 'retry'],
    ['not found, the owner said mark not applied', notFound, 'mark-not-applied', 1, 'record-not-applied'],
    ['not found, the owner said stop', notFound, 'stop', 1, 'stop'],
    ['cannot tell, nobody asked', unreachable, null, 1, 'ask'],
    ['cannot tell, the owner said retry', unreachable, 'retry', 1, 'retry'],
    ['cannot tell, the owner said mark not applied', unreachable, 'mark-not-applied', 1, 'record-not-applied'],
    ['cannot tell, the owner said stop', unreachable, 'stop', 1, 'stop'],
  ])('%s → %s', (_, lookup, answer, unknowns, action) => {
    expect(decideReconcile({ lookup, answer, unknowns, maxUnknowns: 5 }).action).toBe(action);
  });

  test('found carries the evidence; a stop knows whether the effect is confirmed not applied', () => {
    expect(decideReconcile({ lookup: found, answer: null, unknowns: 1, maxUnknowns: 5 })).toEqual({ action: 'record-applied', evidence: { effectId: 'r1' } });
    expect(decideReconcile({ lookup: notFound, answer: 'stop', unknowns: 1, maxUnknowns: 5 })).toMatchObject({ confirmedNotApplied: true });
    expect(decideReconcile({ lookup: unreachable, answer: 'stop', unknowns: 1, maxUnknowns: 5 })).toMatchObject({ confirmedNotApplied: false });
    expect(decideReconcile({ lookup: unreachable, answer: null, unknowns: 1, maxUnknowns: 5 })).toMatchObject({ reason: expect.stringContaining('connection refused') as unknown });
  });
});

// ---- The protocol over in-memory ports -------------------------------------------------------------

function entryFor(state: EffectState, overrides: Partial<EffectEntry> = {}): EffectEntry {
  const key = deriveEffectKey('job-1', null, intent);
  return effectEntrySchema.parse({
    key,
    idempotencyKey: key,
    jobId: 'job-1',
    unit: null,
    intent,
    intentHash: intentFingerprint(intent),
    state,
    attempts: 0,
    unknowns: 0,
    lookups: 0,
    evidence: null,
    reconciled: false,
    lastOutcome: null,
    question: null,
    resolution: null,
    epoch: 1,
    createdAtMs: 0,
    updatedAtMs: 0,
    ...overrides,
  });
}

class MemoryLedger implements EffectLedger {
  readonly history: EffectState[] = [];
  constructor(public current: EffectEntry) {}
  entries() {
    return Promise.resolve([this.current]);
  }
  plan() {
    return Promise.resolve([this.current]);
  }
  find() {
    return Promise.resolve(this.current);
  }
  transition(key: string, from: readonly EffectState[], change: EffectChange) {
    if (key !== this.current.key || !from.includes(this.current.state)) return Promise.reject(new EffectStateConflictError(`not ${from.join('/')}`));
    this.current = applyChange(this.current, change, 2, 1_000);
    this.history.push(this.current.state);
    return Promise.resolve(this.current);
  }
}

class ScriptedAdapter implements EffectAdapter {
  readonly name = 'scripted';
  readonly calls: string[] = [];
  constructor(
    private readonly applies: ApplyOutcome[],
    private readonly lookups: LookupOutcome[],
  ) {}
  apply(_intent: EffectIntent, key: string) {
    this.calls.push(`apply ${key}`);
    const next = this.applies.shift();
    return next ? Promise.resolve(next) : Promise.reject(new Error('no more scripted applies'));
  }
  lookup(key: string) {
    this.calls.push(`lookup ${key}`);
    const next = this.lookups.shift();
    return next ? Promise.resolve(next) : Promise.reject(new Error('no more scripted lookups'));
  }
}

const applied: ApplyOutcome = { kind: 'applied', evidence: { effectId: 'r1' } };
const timedOut: ApplyOutcome = { kind: 'unknown', reason: 'no answer within 300 ms' };

/** Long after every entry's last write (they are written at 0): no request is still on its way. */
const LATER_MS = 3_600_000;

function options(overrides: Partial<SettleOptions> = {}): SettleOptions {
  return { signal: new AbortController().signal, clock: { now: () => LATER_MS }, maxUnknowns: 5, immediateRetries: 2, answerFor: () => null, ...overrides };
}

describe('settling one effect', () => {
  test('planned → applying (durable before the call) → applied with the answer as evidence', async () => {
    const ledger = new MemoryLedger(entryFor('planned'));
    const adapter = new ScriptedAdapter([applied], []);
    const result = await settleEffect(ledger, adapter, ledger.current, options());
    expect(result.kind).toBe('applied');
    expect(ledger.history).toEqual(['applying', 'applied']);
    expect(ledger.current).toMatchObject({ attempts: 1, evidence: { effectId: 'r1' }, reconciled: false });
  });

  test('an apply that times out is looked up before anything else; found means applied, never sent again', async () => {
    const ledger = new MemoryLedger(entryFor('planned'));
    const adapter = new ScriptedAdapter([timedOut], [{ kind: 'found', evidence: { effectId: 'r9' } }]);
    const result = await settleEffect(ledger, adapter, ledger.current, options());
    expect(result.kind).toBe('applied');
    expect(adapter.calls.map((call) => call.split(' ')[0])).toEqual(['apply', 'lookup']);
    expect(ledger.history).toEqual(['applying', 'unknown', 'applied']);
    expect(ledger.current).toMatchObject({ attempts: 1, unknowns: 1, lookups: 1, reconciled: true, evidence: { effectId: 'r9' } });
  });

  test('not found after an unknown outcome: retried under the same key', async () => {
    const ledger = new MemoryLedger(entryFor('planned'));
    const adapter = new ScriptedAdapter([{ kind: 'unknown', reason: '500' }, applied], [{ kind: 'not-found' }]);
    const result = await settleEffect(ledger, adapter, ledger.current, options());
    expect(result.kind).toBe('applied');
    expect(new Set(adapter.calls.filter((call) => call.startsWith('apply')))).toEqual(new Set([`apply ${ledger.current.key}`]));
    expect(adapter.calls).toHaveLength(3);
    expect(ledger.current).toMatchObject({ attempts: 2, unknowns: 1, lookups: 1 });
  });

  test('an entry found in applying (its worker died) is reconciled, not re-sent', async () => {
    const ledger = new MemoryLedger(entryFor('applying', { attempts: 1 }));
    const adapter = new ScriptedAdapter([], [{ kind: 'found', evidence: { effectId: 'r3' } }]);
    expect((await settleEffect(ledger, adapter, ledger.current, options())).kind).toBe('applied');
    expect(adapter.calls.every((call) => call.startsWith('lookup'))).toBe(true);
    expect(ledger.current).toMatchObject({ attempts: 1, unknowns: 1, reconciled: true });
  });

  test.each([
    ['a 10 s send deadline', 10_000],
    ['no stated deadline (a minute)', undefined],
  ])('bug 26: an entry found applying while its request may still be on its way (%s) is neither looked up nor sent until the grace ends; then the lookup decides', async (_, sendTimeoutMs) => {
    const graceMs = sendTimeoutMs === undefined ? DEFAULT_IN_FLIGHT_GRACE_MS : sendTimeoutMs + IN_FLIGHT_MARGIN_MS;
    const ledger = new MemoryLedger(entryFor('applying', { attempts: 1, updatedAtMs: 1_000 }));
    const adapter = Object.assign(new ScriptedAdapter([applied], [{ kind: 'not-found' }]), sendTimeoutMs === undefined ? {} : { sendTimeoutMs });
    const now = { ms: 1_000 + 11_000 };
    const early = await settleEffect(ledger, adapter, ledger.current, options({ clock: { now: () => now.ms } }));
    expect(early).toMatchObject({ kind: 'in-flight', untilMs: 1_000 + graceMs });
    now.ms = 1_000 + graceMs - 1;
    expect((await settleEffect(ledger, adapter, ledger.current, options({ clock: { now: () => now.ms } }))).kind).toBe('in-flight');
    expect({ calls: adapter.calls, history: ledger.history }).toEqual({ calls: [], history: [] });

    now.ms = 1_000 + graceMs;
    expect((await settleEffect(ledger, adapter, ledger.current, options({ clock: { now: () => now.ms } }))).kind).toBe('applied');
    expect(adapter.calls.map((call) => call.split(' ')[0])).toEqual(['lookup', 'apply']);
  });

  test('cannot tell: the entry stays unknown and a person must decide', async () => {
    const ledger = new MemoryLedger(entryFor('planned'));
    const adapter = new ScriptedAdapter([timedOut], [{ kind: 'unreachable', reason: 'connection refused' }]);
    const result = await settleEffect(ledger, adapter, ledger.current, options());
    expect(result).toMatchObject({ kind: 'cannot-tell', reason: expect.stringContaining('connection refused') as unknown });
    expect(ledger.current.state).toBe('unknown');
  });

  test.each<[UnknownAnswer, string, EffectState]>([
    ['retry', 'applied', 'applied'],
    ['mark-not-applied', 'failed', 'failed'],
    ['stop', 'stop', 'unknown'],
  ])('after the owner answers %s, an effect that still cannot be checked is %s', async (answer, kind, state) => {
    const ledger = new MemoryLedger(entryFor('unknown', { attempts: 1, unknowns: 1, question: 'q1' }));
    const adapter = new ScriptedAdapter([applied], [{ kind: 'unreachable', reason: '503' }]);
    const result = await settleEffect(ledger, adapter, ledger.current, options({ answerFor: (entry) => (entry.question === 'q1' ? answer : null) }));
    expect(result.kind).toBe(kind);
    expect(ledger.current.state).toBe(state);
    if (answer !== 'stop') expect(ledger.current.question).toBeNull();
  });

  test('provably not applied (unavailable): back to planned, the caller pauses; a refusal is final', async () => {
    const down = new MemoryLedger(entryFor('planned'));
    const result = await settleEffect(down, new ScriptedAdapter([{ kind: 'unavailable', reason: '503', retryAfterMs: 2_000 }], []), down.current, options());
    expect(result).toMatchObject({ kind: 'unavailable', retryAfterMs: 2_000 });
    expect(down.current).toMatchObject({ state: 'planned', attempts: 1 });

    const refused = new MemoryLedger(entryFor('planned'));
    expect((await settleEffect(refused, new ScriptedAdapter([{ kind: 'rejected', reason: '400' }], []), refused.current, options())).kind).toBe('failed');
    expect(refused.current.state).toBe('failed');
  });

  test('unknown-then-not-found over and over: the step pauses after the immediate retries, and the effect is given up after maxUnknowns', async () => {
    const ledger = new MemoryLedger(entryFor('planned'));
    const adapter = new ScriptedAdapter([timedOut, timedOut, timedOut], [{ kind: 'not-found' }, { kind: 'not-found' }, { kind: 'not-found' }]);
    const result = await settleEffect(ledger, adapter, ledger.current, options({ immediateRetries: 2, maxUnknowns: 10 }));
    expect(result.kind).toBe('unavailable');
    expect(ledger.current).toMatchObject({ state: 'planned', attempts: 3, unknowns: 3 });

    const worn = new MemoryLedger(entryFor('unknown', { attempts: 5, unknowns: 5 }));
    const final = await settleEffect(worn, new ScriptedAdapter([], [{ kind: 'not-found' }]), worn.current, options({ maxUnknowns: 5 }));
    expect(final.kind).toBe('failed');
    expect(worn.current.resolution).toMatch(/given up/);
  });

  test('no apply starts once the claim is lost', async () => {
    const controller = new AbortController();
    controller.abort(new Error('claim lost'));
    const ledger = new MemoryLedger(entryFor('planned'));
    const adapter = new ScriptedAdapter([applied], []);
    await expect(settleEffect(ledger, adapter, ledger.current, options({ signal: controller.signal }))).rejects.toThrow('claim lost');
    expect(adapter.calls).toEqual([]);
    expect(ledger.current.state).toBe('planned');
  });

  test('an adapter that throws is an unknown outcome, not a crash', async () => {
    const ledger = new MemoryLedger(entryFor('planned'));
    const adapter: EffectAdapter = {
      name: 'throwing',
      apply: () => Promise.reject(new Error('socket exploded')),
      lookup: () => Promise.resolve({ kind: 'found', evidence: { effectId: 'r5' } }),
    };
    expect((await settleEffect(ledger, adapter, ledger.current, options())).kind).toBe('applied');
    expect(ledger.history).toEqual(['applying', 'unknown', 'applied']);
  });
});

describe('ledger entries', () => {
  test('a change counts what happened, keeps what it does not mention, and is validated', () => {
    const start = entryFor('unknown', { attempts: 2, unknowns: 1, question: 'q', unknownSinceMs: 5, unknownBecause: 'cancelled while in flight' });
    const next = applyChange(start, { state: 'applied', lastOutcome: 'found', countLookup: true, evidence: { effectId: 'x' }, reconciled: true }, 3, 99);
    expect(next).toMatchObject({ state: 'applied', attempts: 2, unknowns: 1, lookups: 1, question: 'q', epoch: 3, updatedAtMs: 99, evidence: { effectId: 'x' } });
    expect(next).not.toHaveProperty('unknownBecause');
    expect(() => applyChange(start, { state: 'bogus' as EffectState, lastOutcome: '' }, 3, 99)).toThrow();
  });
});

describe('HTTP classification', () => {
  const body = JSON.stringify({ effectId: 'rcv-1', appliedAtMs: 5 });
  test.each<[number, string, ApplyOutcome['kind']]>([
    [201, body, 'applied'],
    [200, JSON.stringify({ effectId: 'rcv-1', appliedAtMs: 5, replayed: true }), 'applied'],
    [201, 'not json', 'unknown'],
    [409, '', 'unknown'],
    [422, '', 'rejected'],
    [400, '{"error":"bad"}', 'rejected'],
    [429, '', 'unavailable'],
    [503, '', 'unavailable'],
    [500, '', 'unknown'],
    [502, '', 'unknown'],
    [302, '', 'unknown'],
  ])('apply answered %i %s → %s', (status, text, kind) => {
    expect(classifyApplyResponse('r', status, text, null).kind).toBe(kind);
  });

  test.each<[number, string, LookupOutcome['kind']]>([
    [200, body, 'found'],
    [200, '{}', 'unreachable'],
    [404, '', 'not-found'],
    [503, '', 'unreachable'],
    [500, '', 'unreachable'],
  ])('lookup answered %i → %s', (status, text, kind) => {
    expect(classifyLookupResponse('r', status, text).kind).toBe(kind);
  });

  test('transport errors: refused means nothing was sent; a timeout or a reset means nobody knows', () => {
    const refused = new TypeError('fetch failed', { cause: Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }) });
    expect(classifyTransportError('r', refused, 300).kind).toBe('unavailable');
    const timeout = new DOMException('The operation was aborted due to timeout', 'TimeoutError');
    expect(classifyTransportError('r', timeout, 300)).toMatchObject({ kind: 'unknown', reason: expect.stringContaining('300 ms') as unknown });
    const reset = new TypeError('fetch failed', { cause: Object.assign(new Error('other side closed'), { code: 'UND_ERR_SOCKET' }) });
    expect(classifyTransportError('r', reset, 300).kind).toBe('unknown');
  });

  /** The adapter over a fetch that answers every apply with 503 and this Retry-After. */
  function answering503(retryAfter: string | null, clock: ManualClock): EffectAdapter {
    const fetch = (): Promise<Response> =>
      Promise.resolve(new Response('{"error":"down"}', { status: 503, headers: retryAfter === null ? {} : { 'retry-after': retryAfter } }));
    return createHttpEffectAdapter({ baseUrl: 'http://receiver.test', timeoutMs: 1_000, name: 'r', fetch, now: () => clock.now() });
  }
  const applyOnce = (adapter: EffectAdapter) => adapter.apply(intent, 'fx_0000000000000000000000000000000000000001', new AbortController().signal);

  test('Retry-After in seconds or as a date (on the injected clock); absent or unreadable gives no hint', async () => {
    const clock = new ManualClock(Date.UTC(2026, 0, 1));
    expect(await applyOnce(answering503('2', clock))).toEqual({ kind: 'unavailable', reason: 'r answered 503', retryAfterMs: 2_000 });
    expect(await applyOnce(answering503(new Date(clock.now() + 5_000).toUTCString(), clock))).toMatchObject({ retryAfterMs: 5_000 });
    expect(await applyOnce(answering503(null, clock))).toEqual({ kind: 'unavailable', reason: 'r answered 503' });
    expect(await applyOnce(answering503('soon', clock))).toEqual({ kind: 'unavailable', reason: 'r answered 503' });
  });

  test.each<[string, string, (nowMs: number) => number]>([
    ['a day in seconds', '86400', () => 86_400_000],
    ['an HTTP date in 2100', 'Fri, 01 Jan 2100 00:00:00 GMT', (nowMs) => Date.UTC(2100, 0, 1) - nowMs],
    ['10^15 ms', '1000000000000', () => 1e15],
    ['more digits than a double holds', '9'.repeat(400), () => Number.MAX_SAFE_INTEGER],
  ])('bug 4: a Retry-After of %s is read as a finite, non-negative delay (capped by the caller, never by trust)', async (_, header, expected) => {
    const clock = new ManualClock(Date.UTC(2026, 0, 1));
    const outcome = await applyOnce(answering503(header, clock));
    expect(outcome).toEqual({ kind: 'unavailable', reason: 'r answered 503', retryAfterMs: expected(clock.now()) });
    const delay = outcome.kind === 'unavailable' ? (outcome.retryAfterMs ?? Number.NaN) : Number.NaN;
    expect(Number.isSafeInteger(delay)).toBe(true);
  });
});

describe('item counts', () => {
  test.each<[EffectState | undefined, EffectState | undefined, string]>([
    ['applied', 'applied', 'done'],
    ['applied', 'planned', 'remaining'],
    ['planned', 'planned', 'remaining'],
    ['applying', 'planned', 'unknown'],
    ['applied', 'unknown', 'unknown'],
    ['failed', 'planned', 'needsAttention'],
    ['applied', 'failed', 'needsAttention'],
  ])('message %s, record %s → %s', (send, record, status) => {
    expect(itemStatus({ send, record })).toBe(status);
  });

  test('counted from the ledger, grouped by recipient', () => {
    const plan = buildPlan('job-1', notifyInput.parse({ campaign: 'Renewal', recipients: 3 }));
    const entries = plan.messages.flatMap((message, index) => {
      const states: EffectState[][] = [['applied', 'applied'], ['unknown', 'planned'], ['planned', 'planned']];
      const [send, record] = states[index] ?? [];
      return [
        entryFor(send ?? 'planned', { key: message.sendKey, idempotencyKey: message.sendKey, intent: { ...intent, kind: 'message', identity: `Renewal/${message.recipient.id}` } }),
        entryFor(record ?? 'planned', { key: message.recordKey, idempotencyKey: message.recordKey, intent: { ...intent, kind: 'record', identity: `Renewal/${message.recipient.id}` } }),
      ];
    });
    expect(countItemsFromLedger(entries)).toEqual({ total: 3, done: 1, remaining: 1, needsAttention: 0, unknown: 1, sent: 1, logged: 1 });
    expect(countItemsFromLedger([])).toEqual(countItems([]));
  });
});

describe('notify configuration', () => {
  test('the receiver comes from PHASELINE_RECEIVER_URL; blank settings count as unset', () => {
    const deps = notifyDepsFromEnv({ PHASELINE_RECEIVER_URL: ' http://127.0.0.1:8787/ ', PHASELINE_RECEIVER_TIMEOUT_MS: '', PHASELINE_RECEIVER_WAIT_SECONDS: '30' });
    expect(deps.adapter.name).toBe('the receiver at 127.0.0.1:8787');
    expect(deps.unavailableWaitMs).toBe(30_000);
  });

  test.each([
    [{}, /PHASELINE_RECEIVER_URL is not set/],
    [{ PHASELINE_RECEIVER_URL: '   ' }, /PHASELINE_RECEIVER_URL is not set/],
    [{ PHASELINE_RECEIVER_URL: 'not a url' }, /is not a URL/],
    [{ PHASELINE_RECEIVER_URL: 'file:///etc/passwd' }, /must be an http\(s\) URL/],
    [{ PHASELINE_RECEIVER_URL: 'http://x', PHASELINE_RECEIVER_TIMEOUT_MS: '-5' }, /PHASELINE_RECEIVER_TIMEOUT_MS must be a positive number/],
  ])('%j fails the job that needs it, naming the setting', (env, message) => {
    expect(() => notifyDepsFromEnv(env)).toThrow(message);
    expect(() => notifyDepsFromEnv(env)).toThrow(TerminalError);
  });
});

describe('the effects of a stopped job, in words and in time', () => {
  const counts = { planned: 2, applying: 1, applied: 3, unknown: 1, failed: 1 };

  test('the sentence is rendered from the counts; whether they are final is said, never guessed from text', () => {
    expect(stoppedEffectsSentence({ counts, settled: false, checkedWith: null })).toBe('Effects: 3 applied, 3 not applied, 2 unknown (being checked).');
    expect(stoppedEffectsSentence({ counts, settled: false, checkedWith: 'the receiver' })).toBe(
      'Effects: 3 applied, 3 not applied, 2 unknown (not yet confirmed by the receiver; checked again later).',
    );
    const final = { ...counts, applying: 0, unknown: 0, applied: 5 };
    expect(stoppedEffectsSentence({ counts: final, settled: true, checkedWith: 'the receiver' })).toBe('Effects: 5 applied, 3 not applied, 0 unknown (final, checked with the receiver).');
    expect(stoppedEffectsSentence({ counts: final, settled: true, checkedWith: null })).toBe('Effects: 5 applied, 3 not applied, 0 unknown (final).');
  });

  test('a cancellation report names the phase, the reason, the sections and the effects', () => {
    expect(cancellationReport({ reason: 'not needed', phase: null, sectionsDone: null, effects: null })).toBe('Cancelled by its owner during its first step (not needed).');
    expect(cancellationReport({ reason: 'r', phase: 'send', sectionsDone: 4, effects: { counts, settled: false, checkedWith: null } })).toBe(
      'Cancelled by its owner during send (r). 4 sections were finished. Effects: 3 applied, 3 not applied, 2 unknown (being checked). ' +
        'Effects already applied (messages sent, payments made) cannot be undone by cancelling.',
    );
  });

  test('a target that cannot answer is asked again as long after as the job has been stopped, between the grace period and an hour', () => {
    const grace = DEFAULT_SETTLE_GRACE_MS;
    expect(settleRecheckAtMs(1_000_000, 1_000_000 - grace, grace)).toBe(1_000_000 + grace);
    expect(settleRecheckAtMs(1_000_000, 1_000_000 - 5 * grace, grace)).toBe(1_000_000 + 5 * grace);
    expect(settleRecheckAtMs(100_000_000, 0, grace)).toBe(100_000_000 + MAX_SETTLE_RECHECK_MS);
    expect(settleRecheckAtMs(1_000, 900, grace)).toBe(1_000 + grace);
  });

  test('the deployed sweeper checks notify jobs with the receiver they sent through; other pipelines have no effects', () => {
    const deps = notifyDepsFromEnv({ PHASELINE_RECEIVER_URL: 'http://127.0.0.1:8787' });
    const settlerFor = notifyStoppedEffects(() => deps);
    expect(settlerFor('notify')?.adapter).toBe(deps.adapter);
    expect(settlerFor('notify')?.progress?.([])).toEqual({});
    expect(settlerFor('research')).toBeNull();
    // Without a receiver setting, the settler fails by name when a stopped notify job needs it.
    expect(() => notifyStoppedEffects(() => notifyDepsFromEnv({}))('notify')).toThrow(/PHASELINE_RECEIVER_URL is not set/);
  });
});
