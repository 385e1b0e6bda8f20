/**
 * The triage pipeline (an agent pipeline written from the toolkit) on the real engine and the
 * Firestore emulator, its model the AI SDK's own mock model handed in through createAiSdkProvider:
 * the lookup tool and the effectful ticket tool called in turn; a cut-off answer retried warm on
 * the same thread; an item that fails every retry skipped visibly; a worker killed after the
 * helpdesk filed a ticket, whose redelivered step finds it by lookup instead of filing it again;
 * and a helpdesk that is down, which makes the job wait (no retry spent) and file once later.
 */
import type { LanguageModelV3Prompt } from '@ai-sdk/provider';
import type { MockLanguageModelV3 } from 'ai/test';
import type { ApplyOutcome, LookupOutcome } from '../../functions/src/agent';
import { pipelineRegistry } from '../../functions/src/core/pipeline';
import { effectEntrySchema } from '../../functions/src/core/effect-ledger';
import { sweep } from '../../functions/src/engine/sweeper';
import { DEFAULT_SETTLE_GRACE_MS } from '../../functions/src/effects/after-stop';
import { cancelJob } from '../../functions/src/engine/owner-actions';
import { createTriagePipeline, triageStoppedEffects, type Helpdesk, type TicketRequest, type TriageDeps } from '../../functions/src/pipelines/triage';
import { JOBS, effectsPath, sectionKey, transcriptPath } from '../../functions/src/store/paths';
import { firestoreCircuit } from '../../functions/src/store/provider-circuit';
import { drainSurvivingKill, engineSuite, gate, reclaimAfterLease } from '../support/engine';
import { hangForever, immediateTimers } from '../support/research';
import { scriptedModel, scriptedProvider, shownResults, userText, type ScriptedTurn } from '../support/scripted-model';

/** The helpdesk as a system of record: tickets by idempotency key, every request counted. */
class MemoryHelpdesk implements Helpdesk {
  readonly name = 'the test helpdesk';
  readonly sendTimeoutMs = 10_000;
  readonly tickets = new Map<string, TicketRequest & { readonly ticketId: string }>();
  fileCalls = 0;
  lookups = 0;
  /** What the next fileTicket does instead of answering normally, once. */
  next: 'file-then-die' | 'unavailable' | null = null;
  onDeath: () => void = () => undefined;

  fileTicket(ticket: TicketRequest, idempotencyKey: string): Promise<ApplyOutcome> {
    this.fileCalls += 1;
    const planned = this.next;
    this.next = null;
    if (planned === 'unavailable') return Promise.resolve({ kind: 'unavailable', reason: 'helpdesk answered 503' });
    const known = this.tickets.get(idempotencyKey);
    const filed = known ?? { ...ticket, ticketId: `T-${this.tickets.size + 1}` };
    this.tickets.set(idempotencyKey, filed);
    if (planned === 'file-then-die') {
      // Filed at the helpdesk; the worker dies before the answer reaches it.
      this.onDeath();
      return hangForever();
    }
    return Promise.resolve({ kind: 'applied', evidence: { ticketId: filed.ticketId, replay: known !== undefined } });
  }

  findTicket(idempotencyKey: string): Promise<LookupOutcome> {
    this.lookups += 1;
    const known = this.tickets.get(idempotencyKey);
    return Promise.resolve(known ? { kind: 'found', evidence: { ticketId: known.ticketId } } : { kind: 'not-found' });
  }
}

/** How the scripted model treats the item it is asked about. */
type Behaviour = 'ticket' | 'no-ticket' | 'cut-off-once' | 'always-cut-off';

const behaviours = new Map<string, Behaviour>();
let cutOffsGiven = 0;

/** Looks the item up, files a ticket when its behaviour says so, then answers with a label; the same thread always gets the same answer. */
function decide(prompt: LanguageModelV3Prompt): ScriptedTurn {
  const asked = /Item ([A-Za-z0-9_-]+): (.*)/.exec(userText(prompt));
  if (!asked) throw new Error('the prompt names no item');
  const [, itemId = '', title = ''] = asked;
  const behaviour = behaviours.get(itemId) ?? 'no-ticket';
  const shown = shownResults(prompt);
  const callId = (tool: string) => `${tool}-${itemId}-${prompt.length}`;
  if (!shown.some((result) => result.toolName === 'find_known_issue')) {
    return { toolCalls: [{ id: callId('lookup'), name: 'find_known_issue', input: { query: title } }] };
  }
  if (behaviour !== 'no-ticket' && !shown.some((result) => result.toolName === 'file_ticket')) {
    return { toolCalls: [{ id: callId('ticket'), name: 'file_ticket', input: { itemId, label: 'bug', summary: `Follow up on ${title}` } }] };
  }
  if (behaviour === 'always-cut-off' || (behaviour === 'cut-off-once' && cutOffsGiven === 0)) {
    cutOffsGiven += 1;
    return { cutOff: 'Label: b' };
  }
  const known = /KI-\d+/.exec(shown.map((result) => result.text).join('\n'))?.[0];
  return behaviour === 'no-ticket' ? { text: 'Label: question\nReason: a how-to question; nothing is broken.' } : { text: `Label: bug\nReason: matches ${known ?? 'no known issue'}.` };
}

let model: MockLanguageModelV3;
let helpdesk: MemoryHelpdesk;

const harness = engineSuite('triage', (firestore) => {
  model = scriptedModel(decide);
  helpdesk = new MemoryHelpdesk();
  const provider = scriptedProvider(model);
  const deps: TriageDeps = {
    provider,
    helpdesk,
    circuit: firestoreCircuit(firestore.db, provider.name, { failureThreshold: 3, windowMs: 60_000, coolDownMs: 60_000 }),
    policy: { warmRetries: 1, coldRetries: 1, transientRetries: 0 },
    timers: immediateTimers,
  };
  return pipelineRegistry(createTriagePipeline(() => deps));
}, {
  beforeEach: () => {
    behaviours.clear();
    cutOffsGiven = 0;
    model.doStreamCalls.length = 0;
    helpdesk.tickets.clear();
    helpdesk.fileCalls = 0;
    helpdesk.lookups = 0;
    helpdesk.next = null;
  },
});

const db = () => harness.firestore.db;
const readJob = (jobId: string) => harness.readJob(jobId);
const report = async (jobId: string) => (await db().doc(`${JOBS}/${jobId}/results/final`).get()).get('markdown') as string;
const ledger = async (jobId: string) => (await db().collection(effectsPath(jobId)).get()).docs.map((doc) => effectEntrySchema.parse(doc.data()));

const csvItem = { id: 'a1', title: 'Export to CSV times out on the yearly report', body: 'It spins for minutes, then fails.' };
const howToItem = { id: 'b2', title: 'How do I change my plan', body: '' };

test('the model calls the lookup, then the effectful ticket tool through the ledger, then answers: one ticket, verdicts published', async () => {
  behaviours.set('a1', 'ticket');
  const jobId = await harness.submit('triage', { items: [csvItem, howToItem] });
  await harness.drain();

  expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  // The model was offered both tools, with the job's labels in the ticket's schema.
  const offered = model.doStreamCalls[0]?.tools?.map((tool) => tool.name);
  expect(offered).toEqual(['find_known_issue', 'file_ticket']);
  // The lookup found the known issue and the model was shown it.
  expect(model.doStreamCalls.some((call) => shownResults(call.prompt).some((result) => result.toolName === 'find_known_issue' && result.text.includes('KI-1')))).toBe(true);
  // One ticket, filed under the key the ledger recorded for the item, and the ledger says applied.
  const entries = await ledger(jobId);
  expect(entries).toHaveLength(1);
  expect(entries[0]).toMatchObject({ state: 'applied', intent: { identity: 'ticket:a1' }, evidence: { ticketId: 'T-1' }, attempts: 1 });
  expect([...helpdesk.tickets.keys()]).toEqual([entries[0]?.idempotencyKey]);
  expect(helpdesk.fileCalls).toBe(1);
  const markdown = await report(jobId);
  expect(markdown).toContain('| a1 | bug | T-1 | KI-1 |');
  expect(markdown).toContain('| b2 | question |  |  |');
});

test('an answer cut off at the output limit is retried warm: the same thread is asked again, no tool runs twice', async () => {
  behaviours.set('a1', 'cut-off-once');
  const jobId = await harness.submit('triage', { items: [csvItem] });
  await harness.drain();

  const job = await readJob(jobId);
  expect(job).toMatchObject({ status: 'completed', outcome: 'complete' });
  expect(cutOffsGiven).toBe(1);
  // Lookup, ticket, the cut-off answer, then the same thread (same messages) asked once more.
  const lengths = model.doStreamCalls.map((call) => call.prompt.length);
  expect(lengths).toHaveLength(4);
  expect(lengths[3]).toBe(lengths[2]);
  expect(job.cost.wastedModelCalls).toBe(1);
  expect(helpdesk.fileCalls).toBe(1);
  expect(await report(jobId)).toContain('| a1 | bug | T-1 |');
});

test('an item that fails every retry is skipped visibly: the job completes partial and names it; the others are triaged', async () => {
  behaviours.set('a1', 'always-cut-off');
  const jobId = await harness.submit('triage', { items: [csvItem, howToItem] });
  await harness.drain();

  expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'partial' });
  const result = await db().doc(`${JOBS}/${jobId}/results/final`).get();
  expect(result.get('missing')).toEqual(['item a1']);
  const markdown = result.get('markdown') as string;
  expect(markdown).toMatch(/\| a1 \| \(skipped\) \| \| \| retries exhausted \(warm 1\/1, cold 1\/1\)/);
  expect(markdown).toContain('| b2 | question |');
  const timeline = (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.map((doc) => doc.get('kind') as string);
  expect(timeline).toContain('section-skipped');
  // The ticket tool ran in the first thread and again in the clean one: the same item, the same effect, one ticket.
  expect(helpdesk.tickets.size).toBe(1);
  expect(helpdesk.fileCalls).toBe(1);
});

test('a worker killed after the helpdesk filed the ticket: the redelivered step looks it up and records it, and never files it again', async () => {
  behaviours.set('a1', 'ticket');
  const death = gate();
  helpdesk.next = 'file-then-die';
  helpdesk.onDeath = death.open;
  const jobId = await harness.submit('triage', { items: [csvItem] });

  await drainSurvivingKill(harness, death.promise);
  expect(helpdesk.tickets.size).toBe(1);
  expect((await ledger(jobId))[0]?.state).toBe('applying');
  await reclaimAfterLease(harness);
  await harness.drain();

  expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  expect(helpdesk.fileCalls).toBe(1);
  expect(helpdesk.lookups).toBeGreaterThanOrEqual(1);
  expect(await ledger(jobId)).toEqual([expect.objectContaining({ state: 'applied', reconciled: true, evidence: { ticketId: 'T-1' } })]);
  expect(await report(jobId)).toContain('| a1 | bug | T-1 |');
});

test('a helpdesk that is down makes the job wait, spending no retry; it resumes by itself and files the ticket once', async () => {
  behaviours.set('a1', 'ticket');
  helpdesk.next = 'unavailable';
  const jobId = await harness.submit('triage', { items: [csvItem] });
  await harness.drain();

  const waiting = await readJob(jobId);
  expect(waiting.status).toBe('waiting');
  expect(waiting.waiting).toMatchObject({ reason: 'provider' });
  expect(waiting.waiting?.question).toContain('the test helpdesk is unavailable');
  expect((await ledger(jobId))[0]?.state).toBe('planned');

  harness.clock.advance((waiting.waiting?.untilMs ?? 0) - harness.clock.now() + 1);
  await sweep({ store: harness.store, queue: harness.queue, log: () => undefined }, harness.clock.now());
  await harness.drain();

  expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  expect(helpdesk.fileCalls).toBe(2);
  expect(helpdesk.tickets.size).toBe(1);
  // The ticket's call waited on the same thread: no attempt was spent on it and nothing was thrown away.
  expect((await readJob(jobId)).cost.wastedModelCalls ?? 0).toBe(0);
});

test('a stored transcript that fails the schema is refused, not continued: the item starts a clean thread and is triaged', async () => {
  const jobId = await harness.submit('triage', { items: [howToItem] });
  // As a transcript written before the log existed, but not one the runner ever wrote.
  await db().doc(transcriptPath(jobId, sectionKey('triage', null, 'b2'))).set({ id: 'b2', transcript: { generation: -1, messages: 'not a thread', attempts: { warm: 0 } } });
  await harness.drain();

  expect(await readJob(jobId)).toMatchObject({ status: 'completed', outcome: 'complete' });
  const timeline = (await db().collection(`${JOBS}/${jobId}/events`).get()).docs.map((doc) => doc.get('kind') as string);
  expect(timeline).toContain('transcript-refused');
  expect(await report(jobId)).toContain('| b2 | question |');
});

test('a job cancelled while its ticket was in flight: the sweeper settles the ticket by lookup in the helpdesk, and files nothing', async () => {
  behaviours.set('a1', 'ticket');
  const death = gate();
  helpdesk.next = 'file-then-die';
  helpdesk.onDeath = death.open;
  const jobId = await harness.submit('triage', { items: [csvItem] }, 'owner-1');
  await drainSurvivingKill(harness, death.promise);

  const { unknownEffects } = await cancelJob(harness.store, { jobId, owner: 'owner-1', reason: 'submitted by mistake' });
  expect(unknownEffects).toBe(1);
  harness.clock.advance(DEFAULT_SETTLE_GRACE_MS + 1);
  const report = await sweep({ store: harness.store, queue: harness.queue, log: () => undefined, stoppedEffects: { settlerFor: triageStoppedEffects(() => helpdesk) } }, harness.clock.now());

  expect(report.stoppedEffects).toMatchObject({ checked: 1, settled: 1, effectsFoundApplied: 1, errors: 0 });
  expect(await ledger(jobId)).toEqual([expect.objectContaining({ state: 'applied', evidence: { ticketId: 'T-1' } })]);
  expect(helpdesk.fileCalls).toBe(1);
  expect((await readJob(jobId)).status).toBe('cancelled');
});
