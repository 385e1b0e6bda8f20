/**
 * `triage`: an agent reads each submitted item (a support request, a bug report), looks it up
 * among the known issues, labels it, and files a ticket in the helpdesk for the ones that need
 * follow-up. One agent section per item, each a checkpoint; an item whose section fails every
 * retry is recorded as skipped and named in the result, which then completes as partial.
 *
 * Different in kind from research (no planning, no fan-out, no long-form text): a short structured
 * verdict per item, and a tool with an external effect. Built on the agent toolkit only:
 * `find_known_issue` is a plain tool; `file_ticket` is an effectful one, so it runs through the
 * effect ledger under a key derived from the job and the item (one ticket per item whatever
 * retries, crashes or clean threads happen), and a ticket whose outcome is unknown is looked up in
 * the helpdesk before anything is sent again.
 */
import { z } from 'zod';
import {
  agentWait,
  createToolbox,
  defineTool,
  runAgentSection,
  tracedToolbox,
  type AgentDeps,
  type AgentTool,
  type ApplyOutcome,
  type LookupOutcome,
  type ModelProvider,
  type SectionPolicy,
  type ProviderCircuit,
  type Timers,
  definePhase,
  definePipeline,
  type PhaseOutcome,
  type StepContext,
} from '../../api';

export const TRIAGE_PIPELINE = 'triage';

/** Labels an item gets when the input names none. */
export const DEFAULT_TRIAGE_LABELS = ['bug', 'question', 'feature-request', 'billing'] as const;
/** The label of an item the agent answered without a usable verdict: a person should look at it. */
export const UNCLASSIFIED = 'unclassified';

const item = z.strictObject({
  id: z.string().regex(/^[A-Za-z0-9_-]{1,40}$/, 'an item id is 1 to 40 letters, digits, _ or -'),
  title: z.string().trim().min(1).max(200),
  body: z.string().max(4_000).default(''),
});

export const triageInput = z
  .strictObject({
    items: z.array(item).min(1, 'give at least one item').max(20, 'at most 20 items a job'),
    labels: z
      .array(z.string().regex(/^[a-z][a-z0-9-]{0,30}$/, 'a label is a short kebab-case word'))
      .min(2)
      .max(8)
      .default([...DEFAULT_TRIAGE_LABELS]),
  })
  .refine((input) => new Set(input.items.map((entry) => entry.id)).size === input.items.length, { message: 'item ids must be unique', path: ['items'] })
  .refine((input) => !input.labels.includes(UNCLASSIFIED), { message: `"${UNCLASSIFIED}" is reserved`, path: ['labels'] });
export type TriageInput = z.output<typeof triageInput>;
type Item = TriageInput['items'][number];

/** A ticket as the helpdesk files it. */
export interface TicketRequest {
  readonly itemId: string;
  readonly label: string;
  readonly summary: string;
}

/** The helpdesk (the system of record for tickets): files under an idempotency key, and answers whether a key was filed. */
export interface Helpdesk {
  readonly name: string;
  /** Files the ticket at most once per key; says applied (with the ticket's ID as `ticketId`), rejected, unavailable or unknown. */
  fileTicket(ticket: TicketRequest, idempotencyKey: string, signal: AbortSignal): Promise<ApplyOutcome>;
  findTicket(idempotencyKey: string, signal: AbortSignal): Promise<LookupOutcome>;
  /** The longest one fileTicket request may take before it gives up. */
  readonly sendTimeoutMs?: number;
}

/** An issue the lookup tool can find. */
export interface KnownIssue {
  readonly id: string;
  readonly title: string;
  readonly label: string;
  readonly workaround: string;
}

/** The issues a deployment knows about by default (a real one hands in its own). */
export const DEFAULT_KNOWN_ISSUES: readonly KnownIssue[] = [
  { id: 'KI-1', title: 'Export to CSV times out for large reports', label: 'bug', workaround: 'Export one month at a time.' },
  { id: 'KI-2', title: 'Invoice shows the wrong currency after a plan change', label: 'billing', workaround: 'Support reissues the invoice.' },
  { id: 'KI-3', title: 'Password reset email arrives late or not at all', label: 'bug', workaround: 'Check the spam folder; resend after ten minutes.' },
];

export interface TriageDeps {
  /** Any model: for an AI SDK LanguageModel, `createAiSdkProvider({ model, ... })`. */
  readonly provider: ModelProvider;
  readonly helpdesk: Helpdesk;
  readonly knownIssues?: readonly KnownIssue[];
  readonly circuit?: ProviderCircuit;
  readonly policy?: Partial<SectionPolicy>;
  readonly timers?: Timers;
}

const verdict = z.discriminatedUnion('skipped', [
  z.strictObject({ skipped: z.literal(false), itemId: z.string(), label: z.string(), reason: z.string(), ticket: z.string().nullable(), knownIssue: z.string().nullable() }),
  z.strictObject({ skipped: z.literal(true), itemId: z.string(), reason: z.string() }),
]);
type Verdict = z.infer<typeof verdict>;
const triageState = z.object({ verdicts: z.array(verdict) });

const MAX_TOOL_ROUNDS = 4;

const words = (text: string): Set<string> => new Set(text.toLowerCase().match(/[a-z0-9]{3,}/g) ?? []);

/** Known issues sharing the most words with the query, best first (at most three). */
export function findKnownIssues(issues: readonly KnownIssue[], query: string): KnownIssue[] {
  const asked = words(query);
  return issues
    .map((issue) => ({ issue, shared: [...words(issue.title)].filter((word) => asked.has(word)).length }))
    .filter((scored) => scored.shared > 0)
    .sort((a, b) => b.shared - a.shared)
    .slice(0, 3)
    .map((scored) => scored.issue);
}

/** The tools one job's items are triaged with: the lookup, and the ticket (labels limited to the job's). */
export function triageTools(deps: Pick<TriageDeps, 'helpdesk' | 'knownIssues'>, labels: readonly string[]): AgentTool[] {
  const issues = deps.knownIssues ?? DEFAULT_KNOWN_ISSUES;
  const findKnownIssue = defineTool({
    name: 'find_known_issue',
    description: 'Searches the known issues by keywords; answers the closest ones with their id, label and workaround.',
    input: z.strictObject({ query: z.string().trim().min(3).max(200) }),
    execute: ({ query }) => JSON.stringify({ matches: findKnownIssues(issues, query) }),
  });
  const fileTicket = defineTool({
    name: 'file_ticket',
    description: 'Files a helpdesk ticket for an item that needs follow-up by a person. One ticket per item.',
    input: z.strictObject({ itemId: z.string().min(1).max(40), label: z.enum(labels as [string, ...string[]]), summary: z.string().trim().min(5).max(300) }),
    effect: {
      target: deps.helpdesk.name,
      // One ticket per item in the job, whichever thread or attempt asks for it.
      identity: ({ itemId }) => `ticket:${itemId}`,
      lookup: (key, signal) => deps.helpdesk.findTicket(key, signal),
      describe: (evidence) => `Ticket filed: ${String(evidence.ticketId ?? 'unnamed')}`,
      ...(deps.helpdesk.sendTimeoutMs === undefined ? {} : { sendTimeoutMs: deps.helpdesk.sendTimeoutMs }),
    },
    execute: (ticket, { idempotencyKey, signal }) => deps.helpdesk.fileTicket(ticket, idempotencyKey, signal),
  });
  return [findKnownIssue, fileTicket];
}

const SYSTEM = [
  'You triage incoming items for a support team, one item at a time.',
  'Use find_known_issue to check whether the item matches a known issue.',
  'If the item needs follow-up by a person, file exactly one ticket for it with file_ticket.',
  'Then answer with two lines: "Label: <one of the labels>" and "Reason: <one sentence>".',
].join(' ');

/** The label and reason of a final answer; a label outside `labels` (or none) is UNCLASSIFIED. */
export function readVerdict(text: string, labels: readonly string[]): { label: string; reason: string } {
  const label = /^\s*label\s*:\s*([a-z0-9-]+)/im.exec(text)?.[1]?.toLowerCase();
  const reason = /^\s*reason\s*:\s*(.+)$/im.exec(text)?.[1]?.trim() ?? text.trim().slice(0, 300);
  return { label: label !== undefined && labels.includes(label) ? label : UNCLASSIFIED, reason };
}

async function triageItem(context: StepContext<TriageInput>, deps: TriageDeps, entry: Item): Promise<Verdict | PhaseOutcome<never>> {
  const { labels } = context.input;
  const agent: AgentDeps = {
    provider: deps.provider,
    // A span per tool call, as the deployed research tools have (no-op spans unless an exporter is configured).
    toolbox: tracedToolbox(createToolbox(triageTools(deps, labels))),
    ...(deps.circuit ? { circuit: deps.circuit } : {}),
    ...(deps.policy ? { policy: deps.policy } : {}),
    ...(deps.timers ? { timers: deps.timers } : {}),
  };
  const outcome = await runAgentSection(context, agent, {
    sectionId: entry.id,
    promptId: `triage-${entry.id}`,
    system: SYSTEM,
    prompt: `Labels: ${labels.join(', ')}.\nItem ${entry.id}: ${entry.title}\n\n${entry.body}`.trimEnd(),
    coldContext: '',
    maxToolRounds: MAX_TOOL_ROUNDS,
  });
  if (outcome.kind === 'provider-wait') return agentWait(outcome);
  if (outcome.kind === 'out-of-time') return { kind: 'yield' };
  if (outcome.kind === 'skipped') return { skipped: true, itemId: entry.id, reason: outcome.reason };
  const { label, reason } = readVerdict(outcome.text, labels);
  // The ticket is read from the ledger, not from the model's words: only an applied effect counts.
  const filed = (await context.effects.entries()).find((effect) => effect.intent.identity === `ticket:${entry.id}` && effect.state === 'applied');
  const ticketId = filed?.evidence?.ticketId;
  const knownIssue = /\bKI-\d+\b/.exec(outcome.text)?.[0] ?? null;
  return { skipped: false, itemId: entry.id, label, reason, ticket: ticketId === undefined || ticketId === null ? null : String(ticketId), knownIssue };
}

export function createTriagePipeline(resolveDeps: () => TriageDeps) {
  const triage = definePhase<TriageInput, z.infer<typeof triageState>>({
    name: 'triage',
    state: triageState,
    section: verdict,
    run: async (context) => {
      const { items } = context.input;
      context.reportProgress({ itemsTotal: items.length });
      for (const entry of items) {
        if (context.sections().some((section) => section.id === entry.id)) continue; // triaged before: reused
        if (context.shouldYield()) return { kind: 'yield' };
        const result = await triageItem(context, resolveDeps(), entry);
        if ('kind' in result) return result;
        await context.recordSection(entry.id, result);
        if (result.skipped) context.note('section-skipped', `item ${entry.id}: skipped after every retry (${result.reason})`);
        const done = context.sections().map((section) => section.data as Verdict);
        context.reportProgress({ itemsDone: done.length, itemsSkipped: done.filter((recorded) => recorded.skipped).length });
      }
      return { kind: 'done', state: { verdicts: context.sections().map((section) => section.data as Verdict) } };
    },
  });

  return definePipeline<TriageInput>({
    name: TRIAGE_PIPELINE,
    description: 'Triage: an agent labels each submitted item, checks the known issues, and files a helpdesk ticket where follow-up is needed.',
    input: triageInput,
    // Its tickets land in the deployment's helpdesk: not open to guest accounts, whose jobs nobody can trace to a person.
    access: 'signed-in',
    phases: [triage],
    publish: (context) => {
      const { verdicts } = context.checkpoint(triage);
      const cell = (text: string) => text.replace(/\|/g, '\\|').replace(/\s+/g, ' ');
      const rows = verdicts.map((entry) =>
        entry.skipped
          ? `| ${entry.itemId} | (skipped) | | | ${cell(entry.reason)} |`
          : `| ${entry.itemId} | ${entry.label} | ${entry.ticket ?? ''} | ${entry.knownIssue ?? ''} | ${cell(entry.reason)} |`,
      );
      const missing = verdicts.filter((entry) => entry.skipped).map((entry) => `item ${entry.itemId}`);
      const markdown = ['# Triage', '', '| Item | Label | Ticket | Known issue | Reason |', '| --- | --- | --- | --- | --- |', ...rows, ''].join('\n');
      return { outcome: missing.length > 0 ? 'partial' : 'complete', title: `Triage of ${verdicts.length} items`, markdown, missing };
    },
  });
}
