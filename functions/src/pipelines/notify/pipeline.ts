/**
 * `notify`: a batch of personalised messages ("send renewal reminders to 120 customers"), each
 * sent through the receiver and then logged to the customer's record.
 *
 *   plan  the planning step writes a validated plan artifact (one entry per message, with the keys
 *         of its two effects) as its checkpoint; running it twice gives the same plan.
 *   send  deterministic code applies the plan through the effect ledger, item by item in plan
 *         order. The ledger is the checkpoint grain: a new step (after a yield, a pause, a crash
 *         or a decision) re-reads it, reconciles whatever was left unresolved, and carries on with
 *         what is not done. Nothing that is done is sent again.
 *
 * When the receiver is down (connection refused, 503) the job waits with reason `provider` and
 * resumes by itself; when an outcome is unknown and the receiver cannot be asked about it, the job
 * waits for its owner, who chooses to retry those effects, write them off, or stop.
 */
import { z } from 'zod';
import { CorruptCheckpointError, TerminalError, UNRESOLVED_EFFECT_STATES, capServerDelay, definePhase, definePipeline, deriveEffectKey, settleEffect, type EffectAdapter, type EffectEntry, type PhaseOutcome, type SettleResult, type StepContext, type UnknownAnswer } from '../../api';
import { countItems, type ItemCounts, progressOf } from './counts';
import { buildPlan, notifyInput, notifyPlanSchema, recordIntent, sendIntent, type NotifyInput, type PlannedMessage } from './plan';

export interface NotifyDeps {
  readonly adapter: EffectAdapter;
  /** How long a pause for an unavailable receiver lasts before the sweeper resumes the job. */
  readonly unavailableWaitMs?: number;
  /** Unusable answers one effect may get in all before an effect the receiver never got is given up on. */
  readonly maxUnknowns?: number;
  /** Unknown-then-not-found rounds for one effect within a step before the job pauses instead. */
  readonly immediateRetries?: number;
}

export const DEFAULT_UNAVAILABLE_WAIT_MS = 60_000;
export const NOTIFY_PIPELINE = 'notify';

/** The options a person is offered when outcomes are unknown and the receiver cannot be asked. */
export const UNKNOWN_OPTIONS = {
  retry: 'retry the unknown ones',
  markNotSent: 'mark them as not sent and continue',
  stop: 'stop here',
} as const;

const ANSWERS: Readonly<Record<string, UnknownAnswer>> = {
  [UNKNOWN_OPTIONS.retry]: 'retry',
  [UNKNOWN_OPTIONS.markNotSent]: 'mark-not-applied',
  [UNKNOWN_OPTIONS.stop]: 'stop',
};

export const UNKNOWN_QUESTION_PREFIX = 'unknown-effects-';
export const UNAVAILABLE_QUESTION_ID = 'receiver-unavailable';

const attentionItem = z.strictObject({ id: z.string(), name: z.string(), address: z.string(), reason: z.string() });
export const sendState = z.strictObject({
  total: z.number().int().positive(),
  done: z.number().int().nonnegative(),
  sent: z.number().int().nonnegative(),
  logged: z.number().int().nonnegative(),
  needsAttention: z.array(attentionItem),
  /** A job cannot complete while an effect's outcome is unknown: the checkpoint itself refuses it. */
  unknown: z.literal(0),
});
export type SendState = z.infer<typeof sendState>;

const iso = (ms: number) => new Date(ms).toISOString();
const seconds = (ms: number) => `${Math.round(ms / 1000)} s`;
const plural = (count: number, word: string) => `${count} ${word}${count === 1 ? '' : 's'}`;

export function createNotifyPipeline(resolveDeps: () => NotifyDeps) {
  const plan = definePhase<NotifyInput, z.infer<typeof notifyPlanSchema>>({
    name: 'plan',
    state: notifyPlanSchema,
    run: (context) => {
      const artifact = buildPlan(context.jobId, context.input);
      const total = artifact.messages.length;
      context.reportProgress(progressOf({ total, done: 0, remaining: total, needsAttention: 0, unknown: 0, sent: 0, logged: 0 }));
      context.note('planned', `${plural(total, 'message')} planned for ${artifact.campaign}`);
      return Promise.resolve({ kind: 'done', state: artifact });
    },
  });

  const send = definePhase<NotifyInput, SendState>({
    name: 'send',
    state: sendState,
    needs: [plan],
    run: (context) => new Batch(context, context.checkpoint(plan).campaign, context.checkpoint(plan).messages, resolveDeps()).run(),
  });

  return definePipeline<NotifyInput>({
    name: NOTIFY_PIPELINE,
    description: 'A batch of personalised messages, each sent through the receiver and logged to the customer record, with an effect ledger.',
    input: notifyInput,
    // It sends messages of the caller's choosing to addresses of their choosing: only to accounts an operator vouched for.
    access: 'granted',
    phases: [plan, send],
    publish: (context) => {
      const { campaign } = context.checkpoint(plan);
      const result = context.checkpoint(send);
      const title = `${campaign}: ${result.done} of ${result.total} sent and logged`;
      const markdown = [
        `# ${title}`,
        '',
        `- Messages sent: ${result.sent}`,
        `- Logged to the customer record: ${result.logged}`,
        `- Need attention: ${result.needsAttention.length}`,
        '',
        ...(result.needsAttention.length > 0
          ? ['## Need attention', '', ...result.needsAttention.map((item) => `- ${item.name} <${item.address}>: ${item.reason}`), '']
          : []),
      ].join('\n');
      return {
        outcome: result.needsAttention.length > 0 ? 'partial' : 'complete',
        title,
        markdown,
        missing: result.needsAttention.map((item) => `${item.name} <${item.address}>: ${item.reason}`),
      };
    },
  });
}

/** One step of the send phase. */
class Batch {
  private readonly byKey = new Map<string, EffectEntry>();
  private readonly adapter: EffectAdapter;

  constructor(
    private readonly context: StepContext<NotifyInput>,
    private readonly campaign: string,
    private readonly messages: readonly PlannedMessage[],
    private readonly deps: NotifyDeps,
  ) {
    this.adapter = deps.adapter;
  }

  async run(): Promise<PhaseOutcome<SendState>> {
    const { context } = this;
    this.checkKeys();
    for (const entry of await context.effects.entries()) this.byKey.set(entry.key, entry);
    const missing = this.messages.flatMap((message) => [
      ...(this.byKey.has(message.sendKey) ? [] : [sendIntent(this.campaign, message)]),
      ...(this.byKey.has(message.recordKey) ? [] : [recordIntent(this.campaign, message)]),
    ]);
    // Every effect of the batch is in the ledger before the first is applied: the ledger alone says what is left.
    if (missing.length > 0) for (const entry of await context.effects.plan(missing)) this.byKey.set(entry.key, entry);

    // 1. Before any new send: settle what an earlier step, a crash or a decision left unresolved.
    const cannotTell: EffectEntry[] = [];
    let stop = false;
    for (const message of this.messages) {
      for (const key of [message.sendKey, message.recordKey]) {
        const entry = this.entry(key);
        if (!UNRESOLVED_EFFECT_STATES.includes(entry.state) && !(entry.state === 'planned' && this.answerFor(entry) === 'stop')) continue;
        const result = await this.settle(entry);
        if (result.kind === 'in-flight') return this.waitOut(result.entry, result.untilMs);
        if (result.kind === 'unavailable') return this.pause(result.reason, result.retryAfterMs);
        if (result.kind === 'cannot-tell') cannotTell.push(result.entry);
        if (result.kind === 'stop') stop = true;
      }
    }
    if (stop) return this.stop();
    if (cannotTell.length > 0) return this.ask(cannotTell, cannotTell.map((entry) => entry.lastOutcome ?? 'lookup failed'));

    // 2. The items in plan order: send, then log.
    for (const message of this.messages) {
      if (this.itemSettled(message)) continue;
      if (context.shouldYield()) {
        this.report();
        return { kind: 'yield' };
      }
      for (const key of [message.sendKey, message.recordKey]) {
        const result = await this.settle(this.entry(key));
        if (result.kind === 'applied') continue;
        if (result.kind === 'failed') break; // the item needs attention; its record is not logged
        if (result.kind === 'unavailable') return this.pause(result.reason, result.retryAfterMs);
        if (result.kind === 'cannot-tell') return this.ask([result.entry], [result.reason]);
        if (result.kind === 'in-flight') return this.waitOut(result.entry, result.untilMs);
        return this.stop();
      }
      this.report();
    }

    const counts = this.counts();
    if (counts.unknown > 0 || counts.remaining > 0) throw new TerminalError(`notify: ${counts.unknown} unknown and ${counts.remaining} remaining items after a full pass`);
    this.report();
    return {
      kind: 'done',
      state: {
        total: counts.total,
        done: counts.done,
        sent: counts.sent,
        logged: counts.logged,
        needsAttention: this.messages.flatMap((message) => {
          const failed = [this.entry(message.sendKey), this.entry(message.recordKey)].find((entry) => entry.state === 'failed');
          if (!failed) return [];
          const what = failed.intent.kind === 'message' ? 'not sent' : 'sent, but not logged to the record';
          return [{ ...message.recipient, reason: `${what}: ${failed.resolution ?? failed.lastOutcome ?? 'failed'}` }];
        }),
        unknown: 0,
      },
    };
  }

  /** The plan's keys must be the ones its intents derive: a plan that disagrees is refused, never applied. */
  private checkKeys(): void {
    for (const message of this.messages) {
      const sendKey = deriveEffectKey(this.context.jobId, null, sendIntent(this.campaign, message));
      const recordKey = deriveEffectKey(this.context.jobId, null, recordIntent(this.campaign, message));
      if (sendKey !== message.sendKey || recordKey !== message.recordKey) {
        throw new CorruptCheckpointError(`The notify plan's keys for ${message.recipient.id} do not match its intents`);
      }
    }
  }

  private entry(key: string): EffectEntry {
    const entry = this.byKey.get(key);
    if (!entry) throw new TerminalError(`Effect ${key} of the plan is missing from the ledger`);
    return entry;
  }

  private answerFor(entry: EffectEntry): UnknownAnswer | null {
    if (entry.question === null) return null;
    const answer = this.context.decisions[entry.question];
    return answer === undefined ? null : (ANSWERS[answer] ?? null);
  }

  private async settle(entry: EffectEntry): Promise<SettleResult> {
    const { context } = this;
    const result = await settleEffect(context.effects, this.adapter, entry, {
      signal: context.signal,
      clock: context.clock,
      maxUnknowns: this.deps.maxUnknowns ?? 5,
      immediateRetries: this.deps.immediateRetries ?? 2,
      answerFor: (current) => this.answerFor(current),
      note: (kind, message) => context.note(kind, message),
    });
    this.byKey.set(result.entry.key, result.entry);
    return result;
  }

  private itemSettled(message: PlannedMessage): boolean {
    const send = this.entry(message.sendKey).state;
    const record = this.entry(message.recordKey).state;
    return send === 'failed' || record === 'failed' || (send === 'applied' && record === 'applied');
  }

  private counts(): ItemCounts {
    return countItems(this.messages.map((message) => ({ send: this.byKey.get(message.sendKey)?.state, record: this.byKey.get(message.recordKey)?.state })));
  }

  private report(): ItemCounts {
    const counts = this.counts();
    this.context.reportProgress(progressOf(counts));
    return counts;
  }

  private summary(counts: ItemCounts): string {
    return `${counts.done} of ${counts.total} done, ${counts.remaining} remaining, ${counts.needsAttention} need attention, ${counts.unknown} unknown`;
  }

  /**
   * A provider wait. The receiver's Retry-After is advice from outside: capped (engine option
   * maxServerDelaySeconds), and a longer one is read as an outage whose resume time the wait states,
   * never as a reason to park the job for as long as the receiver said.
   */
  private pause(reason: string, retryAfterMs: number | null): PhaseOutcome<SendState> {
    const counts = this.report();
    const serverDelay = capServerDelay(retryAfterMs, this.context.limits.maxServerDelayMs);
    const untilMs = this.context.clock.now() + Math.max(this.deps.unavailableWaitMs ?? DEFAULT_UNAVAILABLE_WAIT_MS, serverDelay.delayMs);
    const outage = serverDelay.capped
      ? ` It asked to be retried in ${seconds(serverDelay.requestedMs)}, more than the ${seconds(this.context.limits.maxServerDelayMs)} cap: treated as an outage.`
      : '';
    return {
      kind: 'wait',
      reason: 'provider',
      questionId: UNAVAILABLE_QUESTION_ID,
      question: `Service unavailable: ${this.adapter.name} (${reason}).${outage} ${this.summary(counts)}. Resuming by itself at ${iso(untilMs)}.`,
      untilMs,
    };
  }

  /**
   * An effect another worker was still sending when this step took the job over: nothing is sent
   * or looked up before its request can no longer be on its way; a new step continues then.
   */
  private waitOut(entry: EffectEntry, untilMs: number): PhaseOutcome<SendState> {
    this.report();
    this.context.note('effect-in-flight', `${this.describe(entry)} was still being sent by an earlier worker; it is looked up at ${iso(untilMs)}, once that request can no longer be on its way`);
    return { kind: 'yield', untilMs };
  }

  private describe(entry: EffectEntry): string {
    const message = this.messages.find((candidate) => candidate.sendKey === entry.key || candidate.recordKey === entry.key);
    const who = message ? `${message.recipient.name} <${message.recipient.address}>` : entry.intent.identity;
    return `${who} (${entry.intent.kind === 'message' ? 'the message' : 'the record entry'}, key ${entry.idempotencyKey})`;
  }

  /** Waits for the owner: names what was done, what was not, and what nobody can tell. */
  private async ask(entries: readonly EffectEntry[], reasons: readonly string[]): Promise<PhaseOutcome<SendState>> {
    const { context } = this;
    const pending = entries.find((entry) => entry.question !== null && context.decisions[entry.question] === undefined)?.question;
    const asked = Object.keys(context.decisions).filter((id) => id.startsWith(UNKNOWN_QUESTION_PREFIX)).length;
    const questionId = pending ?? `${UNKNOWN_QUESTION_PREFIX}${asked + 1}`;
    for (const entry of entries) {
      if (entry.question === questionId) continue;
      const tagged = await context.effects.transition(entry.key, ['unknown'], { state: 'unknown', question: questionId, lastOutcome: entry.lastOutcome ?? 'outcome unknown' });
      this.byKey.set(tagged.key, tagged);
    }
    const counts = this.report();
    const listed = entries.slice(0, 10).map((entry) => this.describe(entry));
    const more = entries.length > listed.length ? `, and ${entries.length - listed.length} more` : '';
    const question = [
      `Could not check with ${this.adapter.name} whether ${plural(entries.length, 'effect')} went through (${[...new Set(reasons)].join('; ')}).`,
      `Done: ${counts.done} of ${counts.total} (sent and logged). Not done yet: ${counts.remaining}. Need attention: ${counts.needsAttention}.`,
      `Unknown: ${listed.join('; ')}${more}.`,
      `"${UNKNOWN_OPTIONS.retry}" applies them again under the same idempotency keys (a receiver that honours keys applies each at most once);`,
      `"${UNKNOWN_OPTIONS.markNotSent}" records them as not sent and goes on with the rest; "${UNKNOWN_OPTIONS.stop}" ends the job here.`,
    ].join(' ');
    return { kind: 'wait', reason: 'decision', questionId, question, options: Object.values(UNKNOWN_OPTIONS) };
  }

  private stop(): never {
    const counts = this.report();
    throw new TerminalError(
      `Stopped as the owner decided: ${this.summary(counts)} (${counts.sent} messages sent). ` +
        'Messages already sent cannot be unsent; effects still unknown are checked with the receiver once the job has stopped.',
    );
  }
}
