/** The local receiver and the notify pipeline wired to it, for the effects and notify tests. */
import type { Clock } from '../../functions/src/core/clock';
import type { EngineOptions } from '../../functions/src/core/options';
import { pipelineRegistry, type PipelineRegistry } from '../../functions/src/core/pipeline';
import { createHttpEffectAdapter } from '../../functions/src/effects/http-adapter';
import type { EffectAdapter } from '../../functions/src/effects/port';
import { createNotifyPipeline, type NotifyDeps } from '../../functions/src/pipelines/notify';
import { Receiver } from '../../scripts/receiver';
import { engineSuite, type EngineHarness } from './engine';

export { Receiver } from '../../scripts/receiver';

/** Long enough for a loaded machine to answer a loopback request, short enough that a hang costs little. */
export const TEST_HTTP_TIMEOUT_MS = 300;

export function startReceiver(clock?: Clock): Promise<Receiver> {
  return Receiver.start({ port: 0, ...(clock ? { now: () => clock.now() } : {}) });
}

export function httpAdapter(receiver: Receiver): EffectAdapter {
  return createHttpEffectAdapter({ baseUrl: receiver.url, timeoutMs: TEST_HTTP_TIMEOUT_MS, name: 'the test receiver' });
}

/**
 * The notify pipeline over a receiver, with deps a test can change between steps (swap the
 * adapter for a wrapper, change the pause length).
 */
export function notifySetup(receiver: () => Receiver): { registry: PipelineRegistry; deps: { current: NotifyDeps } } {
  const deps: { current: NotifyDeps } = { current: { adapter: lazyAdapter(receiver), unavailableWaitMs: 60_000 } };
  return { registry: pipelineRegistry(createNotifyPipeline(() => deps.current)), deps };
}

/** An adapter that reads the receiver's URL at call time (the receiver starts after the harness is built). */
function lazyAdapter(receiver: () => Receiver): EffectAdapter {
  return {
    name: 'the test receiver',
    sendTimeoutMs: TEST_HTTP_TIMEOUT_MS,
    apply: (intent, key, signal) => httpAdapter(receiver()).apply(intent, key, signal),
    lookup: (key, signal) => httpAdapter(receiver()).lookup(key, signal),
  };
}

/** How many times the receiver applied a message to each recipient: the real double-send check (keys aside). */
export function messagesPerRecipient(receiver: Receiver): Map<string, number> {
  const counts = new Map<string, number>();
  for (const application of receiver.applied('message')) {
    const payload = (application.intent as { payload?: { recipientId?: unknown } }).payload;
    const id = typeof payload?.recipientId === 'string' ? payload.recipientId : '?';
    counts.set(id, (counts.get(id) ?? 0) + 1);
  }
  return counts;
}

/** Apply requests the receiver got for one key (attempts, replays included). */
export function applyRequestsFor(receiver: Receiver, key: string): number {
  return receiver.requests.filter((request) => request.op === 'apply' && request.key === key).length;
}

/** Waits (polling the event loop, not the clock) until a condition holds. */
export async function eventually(probe: () => boolean | Promise<boolean>, what: string, tries = 2_000): Promise<void> {
  for (let attempt = 0; attempt < tries; attempt += 1) {
    if (await probe()) return;
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
  throw new Error(`never happened: ${what}`);
}

export interface NotifySuite {
  readonly harness: EngineHarness;
  readonly notify: ReturnType<typeof notifySetup>;
  /** This test's receiver (a fresh one per test, stopped after it). */
  readonly receiver: () => Receiver;
}

/**
 * The engine suite for effects tests: the notify pipeline (beside `others`) on the emulator, and a
 * receiver of its own for every test, which the notify pipeline sends to and which stops after it.
 */
export function notifySuite(label: string, setup: { readonly options?: Partial<EngineOptions>; readonly others?: PipelineRegistry } = {}): NotifySuite {
  let current: Receiver | undefined;
  const receiver = (): Receiver => {
    if (!current) throw new Error('no receiver: it starts before each test');
    return current;
  };
  const notify = notifySetup(receiver);
  const harness = engineSuite(label, pipelineRegistry(...([...(setup.others?.values() ?? []), ...notify.registry.values()] as [never])), {
    ...(setup.options ? { options: setup.options } : {}),
    beforeEach: async () => {
      current = await startReceiver(harness.clock);
      notify.deps.current = { adapter: httpAdapter(current), unavailableWaitMs: 60_000 };
    },
    afterEach: async () => {
      await current?.stop();
      current = undefined;
    },
  });
  return { harness, notify, receiver };
}
