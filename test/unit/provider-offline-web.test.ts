/**
 * The offline simulator uses the tools it is offered. With the web tools (`search` and
 * `fetch_page`, no `read`) it searches, fetches some of the hits' URLs, and writes a section that
 * cites the fetched pages by the numbers their results showed, deterministically by seed; with the
 * corpus tools it behaves exactly as it did before the web path existed (a pinned digest of whole
 * runs). The web runs go through the real section runner, web toolbox, SearXNG backend and page
 * fetcher, against the local SearXNG-shaped server over the fixture pages.
 */
import { createHash } from 'node:crypto';
import type { ChatMessage, ToolCall, ToolSpec } from '../../functions/src/agent/provider';
import { runSection, type SectionOutcome } from '../../functions/src/agent/section-runner';
import type { Toolbox } from '../../functions/src/agent/tools';
import { createMemoryArtifactStore } from '../../functions/src/agent/web/artifacts';
import { createPageFetcher } from '../../functions/src/agent/web/page-fetcher';
import { createSearxngBackend } from '../../functions/src/agent/web/search';
import { createWebToolbox, FETCH_PAGE_TOOL, WEB_SEARCH_TOOL } from '../../functions/src/agent/web/toolbox';
import { ManualClock } from '../../functions/src/core/clock';
import { createCorpusToolbox, createOfflineProvider, nextAgentTurn, OFFLINE_NOTE, OFFLINE_WEB_NOTE, READ_TOOL } from '../../functions/src/providers/offline';
import { startResearchWeb, type ResearchWeb } from '../../scripts/lib/research-web';
import { keptTranscript } from '../support/transcripts';

const EPOCH_MS = Date.UTC(2026, 0, 1);
const EXPERT_PROMPT =
  'You are a practising engineer. For the report on "How do durable job pipelines keep long-running AI agent work from being lost or done twice?", ' +
  'write the section "Background" from your perspective, about 150 words.';
const OUTLINE_PROMPT = 'Plan a report answering: "How do leases and fencing tokens keep stale workers from corrupting results?". List exactly 3 section headings, one per line, each starting with "- ".';

let web: ResearchWeb;
beforeAll(async () => {
  web = await startResearchWeb();
});
beforeEach(() => web.reset());
afterAll(() => web.close());

function webToolbox(clock: ManualClock): Toolbox {
  return createWebToolbox({
    search: createSearxngBackend({ baseUrl: web.url, timeoutMs: 10_000 }),
    pages: createPageFetcher({ timeoutMs: 10_000, maxBytes: 2_000_000, maxRedirects: 5, allowedAddresses: [{ address: '127.0.0.1', port: Number(new URL(web.url).port) }] }),
    artifacts: createMemoryArtifactStore(),
    clock,
    pageTokenBudget: 4_000,
  }).forJob('job-1');
}

interface Run {
  readonly outcome: SectionOutcome;
  readonly messages: readonly ChatMessage[];
}

/** One section through the real runner, the offline provider and `toolbox`, the transcript kept in memory. */
async function runWith(seed: number, toolbox: Toolbox, clock: ManualClock, prompt = EXPERT_PROMPT): Promise<Run> {
  const kept = keptTranscript();
  const outcome = await runSection(
    { sectionId: 's1', promptId: 'p1', system: 'You are a research assistant. Use the tools.', prompt, coldContext: '', maxToolRounds: 6 },
    {
      provider: createOfflineProvider({ seed, clock, sleep: () => Promise.resolve() }),
      toolbox,
      signal: new AbortController().signal,
      transcripts: kept.port,
    },
  );
  return { outcome, messages: kept.last()?.messages ?? [] };
}

const callsOf = (messages: readonly ChatMessage[]): ToolCall[] => messages.flatMap((message) => (message.role === 'assistant' ? (message.toolCalls ?? []) : []));
const urlOf = (call: ToolCall): string => (JSON.parse(call.arguments) as { url: string }).url;
const hitUrlsOf = (messages: readonly ChatMessage[]): string[] =>
  messages.flatMap((message) => (message.role === 'tool' && message.name === WEB_SEARCH_TOOL ? (message.sources ?? []).map((source) => source.url) : []));

describe('offline simulator on the web tools', () => {
  test('searches, then fetches hits with fetch_page, then writes a section citing the fetched pages by the numbers shown', async () => {
    const clock = new ManualClock(EPOCH_MS);
    const { outcome, messages } = await runWith(1, webToolbox(clock), clock);

    expect(outcome.kind).toBe('written');
    if (outcome.kind !== 'written') return;
    const calls = callsOf(messages);
    const firstFetch = calls.findIndex((call) => call.name === FETCH_PAGE_TOOL);
    expect(calls.slice(0, firstFetch).map((call) => call.name)).toEqual(calls.slice(0, firstFetch).map(() => WEB_SEARCH_TOOL));
    expect(calls.slice(firstFetch).map((call) => call.name)).toEqual(calls.slice(firstFetch).map(() => FETCH_PAGE_TOOL));
    expect(calls.some((call) => call.name === READ_TOOL)).toBe(false);
    const fetched = calls.filter((call) => call.name === FETCH_PAGE_TOOL).map(urlOf);
    expect(fetched.length).toBeGreaterThanOrEqual(2);
    // Only URLs search returned, each once; the server saw exactly those page requests.
    const hits = hitUrlsOf(messages);
    for (const url of fetched) expect(hits).toContain(url);
    expect(new Set(fetched).size).toBe(fetched.length);
    expect(Object.fromEntries(web.pageFetches())).toEqual(Object.fromEntries(fetched.map((url) => [url, 1])));

    // The answer: the web note, then paragraphs each ending with the number of a page it fetched.
    const [note, ...paragraphs] = outcome.text.split('\n\n');
    expect(note).toBe(OFFLINE_WEB_NOTE);
    expect(paragraphs.length).toBeGreaterThanOrEqual(2);
    const numberOf = new Map(outcome.sources.map((source) => [source.url, source.number]));
    const fetchedNumbers = new Set(fetched.map((url) => numberOf.get(url)));
    for (const paragraph of paragraphs) {
      const marker = /\s\[(\d+)\]$/.exec(paragraph);
      expect(marker).not.toBeNull();
      expect(fetchedNumbers).toContain(Number(marker?.[1]));
      // Whole sentences copied from the pages, not their headings or bylines.
      for (const sentence of paragraph.replace(/\s\[\d+\]$/, '').split(/(?<=[.!?])\s+(?=[A-Z0-9"])/)) expect(sentence).toMatch(/[.!?]["')\]]?$/);
    }
    expect(outcome.text).not.toMatch(/By [A-Z][a-z]+ [A-Z][a-z]+ ·|Subscribe|©/);
  });

  test('is deterministic by seed: the same seed replays the same calls and text; seeds differ in what and how they fetch', async () => {
    const runOf = async (seed: number) => {
      const clock = new ManualClock(EPOCH_MS);
      const { outcome, messages } = await runWith(seed, webToolbox(clock), clock);
      // The fetches turn by turn: which pages, grouped as the agent asked for them.
      const fetchTurns = messages.flatMap((message) =>
        message.role === 'assistant' && message.toolCalls?.[0]?.name === FETCH_PAGE_TOOL ? [message.toolCalls.map((call) => new URL(urlOf(call)).pathname)] : [],
      );
      return { outcome, calls: callsOf(messages), fetchTurns };
    };
    const first = await runOf(7);
    expect(await runOf(7)).toEqual(first);

    const plans = new Set<string>();
    for (let seed = 1; seed <= 10; seed += 1) plans.add(JSON.stringify((await runOf(seed)).fetchTurns));
    expect(plans.size).toBeGreaterThan(1);
  });

  test('a page that cannot be fetched is not asked for again: the agent goes on to the next hit', () => {
    const specs: ToolSpec[] = [
      { name: WEB_SEARCH_TOOL, description: 'web search', parameters: {} },
      { name: FETCH_PAGE_TOOL, description: 'fetch a page', parameters: {} },
    ];
    const hit = (path: string, score: number) => ({ id: `https://example.org/${path}`, url: `https://example.org/${path}`, title: path, snippet: 'leases and fencing', score });
    const prompt = 'Leases and fencing tokens, about 60 words.';
    const messages: ChatMessage[] = [{ role: 'user', content: prompt, promptId: 'p' }];
    const answer = (call: ToolCall, content: unknown) => messages.push({ role: 'tool', toolCallId: call.id, name: call.name, content: JSON.stringify(content) });

    const search = nextAgentTurn(3, messages, specs);
    messages.push({ role: 'assistant', content: search.content, toolCalls: [...search.toolCalls] });
    for (const call of search.toolCalls) answer(call, { query: 'x', backend: 'searxng', results: [hit('a', 3), hit('b', 2), hit('c', 1)] });

    const fetchedInOrder: string[] = [];
    for (let turn = 0; turn < 6; turn += 1) {
      const next = nextAgentTurn(3, messages, specs);
      if (next.toolCalls.length === 0) break;
      messages.push({ role: 'assistant', content: next.content, toolCalls: [...next.toolCalls] });
      for (const call of next.toolCalls) {
        expect(call.name).toBe(FETCH_PAGE_TOOL);
        const url = urlOf(call);
        fetchedInOrder.push(url);
        if (url.endsWith('/a')) answer(call, { error: 'The page answered HTTP 404.', url, reason: 'http_error' });
        else answer(call, { id: url, url, title: `Page ${url.slice(-1)}`, text: 'Leases expire when heartbeats stop arriving at the store. Fencing tokens refuse the writes of stale workers.' });
      }
    }
    expect(fetchedInOrder).toEqual(['https://example.org/a', 'https://example.org/b', 'https://example.org/c']);
    const final = nextAgentTurn(3, messages, specs);
    expect(final.toolCalls).toEqual([]);
    expect(final.content).toMatch(new RegExp(`^${OFFLINE_WEB_NOTE.replace(/[.]/g, '\\.')}`));
    expect(final.content).toContain('Leases expire when heartbeats stop arriving at the store.');
  });

  test('with the corpus tools offered it reads the corpus, even when fetch_page is offered too', () => {
    const specs: ToolSpec[] = [
      { name: WEB_SEARCH_TOOL, description: 'search', parameters: {} },
      { name: READ_TOOL, description: 'read', parameters: {} },
      { name: FETCH_PAGE_TOOL, description: 'fetch a page', parameters: {} },
    ];
    const messages: ChatMessage[] = [{ role: 'user', content: 'Leases and fencing tokens, about 60 words.', promptId: 'p' }];
    const search = nextAgentTurn(3, messages, specs);
    expect(search.content).toMatch(/searching the bundled corpus/);
    messages.push({ role: 'assistant', content: search.content, toolCalls: [...search.toolCalls] });
    for (const call of search.toolCalls) {
      messages.push({ role: 'tool', toolCallId: call.id, name: call.name, content: JSON.stringify({ query: 'x', results: [{ id: 'leases', title: 'Leases', snippet: 's', score: 1 }] }) });
    }
    expect(nextAgentTurn(3, messages, specs).toolCalls.map((call) => [call.name, call.arguments])).toEqual([[READ_TOOL, JSON.stringify({ id: 'leases' })]]);
  });
});

describe('offline simulator on the corpus tools: unchanged', () => {
  // Digests of whole sections (outcome and saved transcript) recorded before the web path was
  // added: any change to what the corpus agent asks, reads or writes changes them.
  test.each([
    [1, 'expert', 'f4dc4c9a3b1cc335'],
    [1, 'outline', '3e42effd38a36f8c'],
    [7, 'expert', '119535576fabe72f'],
    [7, 'outline', 'a3d066f6a9eca756'],
    [11, 'expert', '15d7052bf6a7f90e'],
    [11, 'outline', '08319cec6ae805f0'],
  ])('seed %i, %s prompt: the same run as before, byte for byte', async (seed, which, expected) => {
    const clock = new ManualClock(EPOCH_MS);
    const kept = keptTranscript();
    const outcome = await runSection(
      { sectionId: 's', promptId: 'p', system: 'sys', prompt: which === 'expert' ? EXPERT_PROMPT : OUTLINE_PROMPT, coldContext: '', maxToolRounds: 6 },
      {
        provider: createOfflineProvider({ seed, clock, sleep: () => Promise.resolve() }),
        toolbox: createCorpusToolbox({ seed, clock }),
        signal: new AbortController().signal,
        transcripts: kept.port,
      },
    );
    expect(outcome.kind === 'written' ? outcome.text.split('\n\n')[0] : outcome.kind).toBe(OFFLINE_NOTE);
    expect(createHash('sha256').update(JSON.stringify([outcome, kept.last()])).digest('hex').slice(0, 16)).toBe(expected);
  });
});
