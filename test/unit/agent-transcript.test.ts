/**
 * Transcript soundness, warm-retry repair and compaction, over many transcript shapes. Every case
 * states the exact kept and dropped messages (or the exact refusal reason).
 */
import type { ChatMessage, NumberedSource, ToolCall } from '../../functions/src/agent/provider';
import {
  citationKey,
  compactionStub,
  compactTranscript,
  describeProblem,
  estimateTokens,
  findProblems,
  findResumeProblems,
  openToolCalls,
  numberSources,
  repairForWarmRetry,
  splitCitationKey,
  threadSources,
  withoutSources,
  type WarmRepair,
} from '../../functions/src/agent/transcript';

const S: ChatMessage = { role: 'system', content: 'You write one section of a research report.' };
const prompt = (promptId = 'p1', content = `Write section ${promptId}.`): ChatMessage => ({ role: 'user', content, promptId });
const P = prompt();
const user = (content: string): ChatMessage => ({ role: 'user', content });
const call = (id: string, name = 'search', args = '{"q":"x"}'): ToolCall => ({ id, name, arguments: args });
const ask = (...calls: ToolCall[]): ChatMessage => ({ role: 'assistant', content: null, toolCalls: calls });
const result = (id: string, content = `result of ${id}`, name = 'search'): ChatMessage => ({ role: 'tool', toolCallId: id, name, content });
const say = (content: string): ChatMessage => ({ role: 'assistant', content });

const A1 = ask(call('c1'));
const T1 = result('c1');
const A2 = ask(call('c2'));
const T2 = result('c2');

interface RepairCase {
  readonly name: string;
  readonly messages: readonly ChatMessage[];
  readonly promptId?: string;
  readonly expected: WarmRepair;
}

const kept = (messages: ChatMessage[], dropped: ChatMessage[] = [], stoppedBecause: string | null = null, openCalls: ToolCall[] = []): WarmRepair => ({
  sound: true,
  messages,
  openCalls,
  dropped,
  stoppedBecause,
});
/** A kept transcript that ends in a group cut short: its recorded results stay, `openCalls` still have to run. */
const resumed = (messages: ChatMessage[], ...openIds: string[]): WarmRepair => kept(messages, [], null, openIds.map((id) => call(id)));

const multi = ask(call('c1'), call('c2'), call('c3'));
const T3 = result('c3');
const compactedResult: ChatMessage = { role: 'tool', toolCallId: 'c1', name: 'search', content: '[compacted: 5123 characters of search results]' };
const emptyCalls: ChatMessage = { role: 'assistant', content: 'Let me think.', toolCalls: [] };
const earlier = prompt('p0', 'Write section p0.');

const repairCases: RepairCase[] = [
  { name: 'empty transcript', messages: [], expected: { sound: false, reason: 'the transcript has no prompt p1' } },
  { name: 'prompt only', messages: [S, P], expected: kept([S, P]) },
  { name: 'prompt without a system message', messages: [P], expected: kept([P]) },
  { name: 'one complete group', messages: [S, P, A1, T1], expected: kept([S, P, A1, T1]) },
  {
    name: 'bug 3: a multi-tool turn cut short keeps its recorded results; only the call without one is open',
    messages: [S, P, multi, T1, T3],
    expected: resumed([S, P, multi, T1, T3], 'c2'),
  },
  {
    name: 'bug 3: a multi-tool turn cut short with results out of order keeps them in call order',
    messages: [S, P, multi, T3, T1],
    expected: resumed([S, P, multi, T1, T3], 'c2'),
  },
  {
    name: 'multi-tool call with all results missing: the recorded turn is kept, every call open',
    messages: [S, P, ask(call('c1'), call('c2'))],
    expected: resumed([S, P, ask(call('c1'), call('c2'))], 'c1', 'c2'),
  },
  {
    name: 'an unfinished group followed by more messages is refused from there',
    messages: [S, P, ask(call('c1'), call('c2')), T1, say('Done.')],
    expected: kept([S, P], [ask(call('c1'), call('c2')), T1, say('Done.')], 'incomplete tool group at 2: 1 of 2 results'),
  },
  {
    name: 'trailing assistant text',
    messages: [S, P, A1, T1, say('Here is the section.')],
    expected: kept([S, P, A1, T1], [say('Here is the section.')], 'assistant message without tool calls at 4'),
  },
  {
    name: 'orphan tool result before the prompt',
    messages: [S, result('x'), P, A1, T1],
    expected: { sound: false, reason: 'the transcript up to prompt p1 is unsound: tool result for an unknown call (x) at message 1' },
  },
  {
    name: 'orphan tool result right after the prompt',
    messages: [S, P, result('x'), A1, T1],
    expected: kept([S, P], [result('x'), A1, T1], 'unexpected tool message at 2'),
  },
  {
    name: 'orphan tool result after a complete group (the whole run is refused)',
    messages: [S, P, A1, T1, A2, T2, result('x')],
    expected: kept([S, P, A1, T1], [A2, T2, result('x')], 'tool result x at 6 does not answer the group at 4'),
  },
  {
    name: 'repeated prompt: the latest one wins',
    messages: [S, P, say('A first draft.'), P, A2, T2, ask(call('c3'))],
    expected: resumed([S, P, say('A first draft.'), P, A2, T2, ask(call('c3'))], 'c3'),
  },
  {
    name: 'only an earlier section prompt',
    messages: [S, earlier, A1, T1],
    expected: { sound: false, reason: 'the transcript has no prompt p1' },
  },
  {
    name: 'an earlier section before the prompt is kept as context',
    messages: [S, earlier, A1, T1, say('Section p0 text.'), P, A2, T2],
    expected: kept([S, earlier, A1, T1, say('Section p0 text.'), P, A2, T2]),
  },
  {
    name: 'another section prompt after ours stops the walk',
    messages: [S, P, A1, T1, prompt('p2'), A2, T2],
    expected: kept([S, P, A1, T1], [prompt('p2'), A2, T2], 'unexpected user message at 4'),
  },
  {
    name: 'results out of order are normalised to call order',
    messages: [S, P, multi, T3, T1, T2],
    expected: kept([S, P, multi, T1, T2, T3]),
  },
  {
    name: 'duplicate result inside a group',
    messages: [S, P, ask(call('c1'), call('c2')), T1, result('c1', 'again'), T2],
    expected: kept([S, P], [ask(call('c1'), call('c2')), T1, result('c1', 'again'), T2], 'second result for c1 at 4'),
  },
  {
    name: 'duplicate result after an otherwise complete group',
    messages: [S, P, A1, T1, T1],
    expected: kept([S, P], [A1, T1, T1], 'second result for c1 at 4'),
  },
  {
    name: 'tool result for an unknown ID inside a group',
    messages: [S, P, ask(call('c1'), call('c2')), T1, result('zz')],
    expected: kept([S, P], [ask(call('c1'), call('c2')), T1, result('zz')], 'tool result zz at 4 does not answer the group at 2'),
  },
  {
    name: 'user message in the middle',
    messages: [S, P, A1, T1, user('Also check the 2024 figures.'), A2, T2],
    expected: kept([S, P, A1, T1], [user('Also check the 2024 figures.'), A2, T2], 'unexpected user message at 4'),
  },
  {
    name: 'two complete groups then an incomplete one',
    messages: [S, P, A1, T1, A2, T2, ask(call('c3'), call('c4')), T3],
    expected: resumed([S, P, A1, T1, A2, T2, ask(call('c3'), call('c4')), T3], 'c4'),
  },
  {
    name: 'a compacted transcript (stubs still paired) is sound',
    messages: [S, P, A1, compactedResult, A2, T2],
    expected: kept([S, P, A1, compactedResult, A2, T2]),
  },
  {
    name: 'unsound prefix: a call before the prompt was never answered',
    messages: [S, earlier, A1, P, A2, T2],
    expected: { sound: false, reason: 'the transcript up to prompt p1 is unsound: tool call without a result (c1) at message 2' },
  },
  {
    name: 'unsound prefix: a result outside its group',
    messages: [S, earlier, A1, say('Hmm.'), T1, P],
    expected: { sound: false, reason: 'the transcript up to prompt p1 is unsound: tool result outside its call group (c1) at message 4' },
  },
  {
    name: 'assistant message with an empty toolCalls array',
    messages: [S, P, A1, T1, emptyCalls, A2, T2],
    expected: kept([S, P, A1, T1], [emptyCalls, A2, T2], 'assistant message without tool calls at 4'),
  },
  {
    name: 'system message after the prompt',
    messages: [S, P, A1, T1, S],
    expected: kept([S, P, A1, T1], [S], 'unexpected system message at 4'),
  },
  {
    name: 'a call ID reused by a later group',
    messages: [S, P, A1, T1, A1, result('c1', 'second')],
    expected: kept([S, P, A1, T1], [A1, result('c1', 'second')], 'tool call ID c1 reused at 4'),
  },
  {
    name: 'a call ID that repeats the prefix',
    messages: [S, earlier, A1, T1, P, A1, T1],
    expected: kept([S, earlier, A1, T1, P], [A1, T1], 'tool call ID c1 reused at 5'),
  },
  {
    name: 'a call ID used twice in one message',
    messages: [S, P, ask(call('c1'), call('c1')), T1, T1],
    expected: kept([S, P], [ask(call('c1'), call('c1')), T1, T1], 'tool call ID c1 reused at 2'),
  },
  {
    name: 'a result that names another tool',
    messages: [S, P, A1, result('c1', 'page', 'fetch')],
    expected: kept([S, P], [A1, result('c1', 'page', 'fetch')], 'tool result c1 at 3 names fetch, the call names search'),
  },
  {
    name: 'a prompt with the same text but another promptId is not the prompt',
    messages: [S, prompt('p9', 'Write section p1.'), A1, T1],
    expected: { sound: false, reason: 'the transcript has no prompt p1' },
  },
];

describe('repairForWarmRetry', () => {
  test.each(repairCases)('$name', ({ messages, promptId, expected }) => {
    expect(repairForWarmRetry(messages, promptId ?? 'p1')).toEqual(expected);
  });

  test('covers at least twenty transcript shapes', () => {
    expect(repairCases.length).toBeGreaterThanOrEqual(20);
  });

  test('leaves its input untouched while normalising result order', () => {
    const messages = [S, P, multi, T3, T1, T2];
    const before = structuredClone(messages);
    const repaired = repairForWarmRetry(messages, 'p1');
    expect(messages).toEqual(before);
    if (!repaired.sound) throw new Error('expected a sound repair');
    expect(repaired.messages).toEqual([S, P, multi, T1, T2, T3]);
  });

  test('what it keeps is sound once its open calls are answered, and kept + dropped accounts for every message', () => {
    for (const { messages, expected } of repairCases) {
      if (!expected.sound) continue;
      const repaired = repairForWarmRetry(messages, 'p1');
      if (!repaired.sound) throw new Error('expected a sound repair');
      expect(findResumeProblems(repaired.messages)).toEqual([]);
      expect(openToolCalls(repaired.messages)).toEqual(repaired.openCalls);
      const answered = [...repaired.messages, ...repaired.openCalls.map((open) => result(open.id, 'late', open.name))];
      expect(findProblems(answered)).toEqual([]);
      expect(repaired.messages.length + repaired.dropped.length).toBe(messages.length);
    }
  });
});

describe('openToolCalls', () => {
  test('the calls of the trailing group without a result, in call order', () => {
    expect(openToolCalls([S, P, multi, T2])).toEqual([call('c1'), call('c3')]);
    expect(openToolCalls([S, P, multi])).toEqual([call('c1'), call('c2'), call('c3')]);
  });

  test('none when the transcript ends with a complete group, the prompt or text', () => {
    expect(openToolCalls([S, P, A1, T1])).toEqual([]);
    expect(openToolCalls([S, P])).toEqual([]);
    expect(openToolCalls([S, P, A1, T1, say('Done.')])).toEqual([]);
    expect(openToolCalls([])).toEqual([]);
  });
});

describe('findProblems', () => {
  test('a sound transcript has none', () => {
    expect(findProblems([S, P, multi, T2, T3, T1, ask(call('c4')), result('c4'), say('Done.')])).toEqual([]);
  });

  test('an empty transcript has none', () => {
    expect(findProblems([])).toEqual([]);
  });

  test('lists every kind of problem, in message order', () => {
    const messages: ChatMessage[] = [
      S,
      result('ghost'), // 1: orphan
      P,
      ask(call('c1'), call('c2')), // 3: c2 never answered
      T1,
      result('c1', 'again'), // 5: duplicate
      ask(call('c3')), // 6
      say('Thinking.'),
      T3, // 8: misplaced (its group closed at 7)
      ask(call('c1')), // 9: call ID reused
      ask(call('c5', 'search')),
      result('c5', 'page', 'fetch'), // 11: name mismatch
    ];
    expect(findProblems(messages)).toEqual([
      { kind: 'orphan_result', index: 1, toolCallId: 'ghost' },
      { kind: 'unanswered_call', index: 3, toolCallId: 'c2' },
      { kind: 'duplicate_result', index: 5, toolCallId: 'c1' },
      { kind: 'misplaced_result', index: 8, toolCallId: 'c3' },
      { kind: 'duplicate_call_id', index: 9, toolCallId: 'c1' },
      { kind: 'result_name_mismatch', index: 11, toolCallId: 'c5' },
    ]);
  });

  test('a result that comes before its call is an orphan, and the call is unanswered', () => {
    expect(findProblems([P, T1, A1])).toEqual([
      { kind: 'orphan_result', index: 1, toolCallId: 'c1' },
      { kind: 'unanswered_call', index: 2, toolCallId: 'c1' },
    ]);
  });

  test('a result for an earlier group, after a later group opened, is misplaced', () => {
    expect(findProblems([P, A1, A2, T2, T1])).toEqual([{ kind: 'misplaced_result', index: 4, toolCallId: 'c1' }]);
  });

  test('problems read as sentences', () => {
    expect(describeProblem({ kind: 'unanswered_call', index: 3, toolCallId: 'c2' })).toBe('tool call without a result (c2) at message 3');
  });
});

describe('estimateTokens', () => {
  test('about one token per four characters plus four per message', () => {
    expect(estimateTokens([])).toBe(0);
    expect(estimateTokens([{ role: 'system', content: 'abcd' }])).toBe(1 + 4);
    // id (2) + name (6) + arguments (2) = 10 characters -> 3 tokens
    expect(estimateTokens([ask(call('c1', 'search', '{}'))])).toBe(3 + 4);
    // content (5) + toolCallId (2) + name (6) = 13 characters -> 4 tokens
    expect(estimateTokens([result('c1', 'hello', 'search')])).toBe(4 + 4);
  });
});

describe('compactTranscript', () => {
  const big = (id: string, size: number, name = 'search'): ChatMessage => result(id, 'x'.repeat(size), name);
  const stubbed = (id: string, size: number, name = 'search'): ChatMessage => result(id, `[compacted: ${size} characters of ${name} results]`, name);

  test('returns an equal copy when the transcript already fits', () => {
    const messages = [S, P, A1, T1];
    const compacted = compactTranscript(messages, 10_000);
    expect(compacted).toEqual(messages);
    expect(compacted).not.toBe(messages);
  });

  test('stubs older tool results first, oldest first, and stops as soon as it fits', () => {
    const messages = [S, P, A1, big('c1', 4000), A2, big('c2', 4000), ask(call('c3')), big('c3', 4000)];
    const target = estimateTokens(messages) - 900; // one stub (about 990 tokens saved) is enough
    const compacted = compactTranscript(messages, target);
    expect(compacted).toEqual([S, P, A1, stubbed('c1', 4000), A2, big('c2', 4000), ask(call('c3')), big('c3', 4000)]);
    expect(compacted && estimateTokens(compacted)).toBeLessThanOrEqual(target);
  });

  test('the stub names the size and the tool', () => {
    expect(compactionStub({ role: 'tool', toolCallId: 'c1', name: 'search', content: 'y'.repeat(5123) })).toBe(
      '[compacted: 5123 characters of search results]',
    );
  });

  test('then drops whole older groups after the prompt, keeping pairing, the system message and the prompt', () => {
    const longArgs = (id: string): ChatMessage => ask(call(id, 'search', `{"q":"${'q'.repeat(2000)}"}`));
    const messages = [S, P, longArgs('c1'), big('c1', 3000), longArgs('c2'), big('c2', 3000), ask(call('c3')), big('c3', 100)];
    // Stubs alone leave the two long calls (about 1000 tokens); dropping the oldest group is enough.
    const compacted = compactTranscript(messages, 800);
    expect(compacted).toEqual([S, P, longArgs('c2'), stubbed('c2', 3000), ask(call('c3')), big('c3', 100)]);
    expect(findProblems(compacted ?? [])).toEqual([]);
  });

  test('never drops groups before the prompt (they are only stubbed)', () => {
    const longArgs = (id: string): ChatMessage => ask(call(id, 'search', `{"q":"${'q'.repeat(2000)}"}`));
    const messages = [S, earlier, longArgs('c0'), big('c0', 3000), say('Section p0.'), P, longArgs('c1'), big('c1', 3000), A2, T2];
    const compacted = compactTranscript(messages, 1000);
    expect(compacted).toEqual([S, earlier, longArgs('c0'), stubbed('c0', 3000), say('Section p0.'), P, A2, T2]);
  });

  test('stubs the newest group last, when nothing older is left', () => {
    const messages = [S, P, A1, big('c1', 8000)];
    expect(compactTranscript(messages, 100)).toEqual([S, P, A1, stubbed('c1', 8000)]);
  });

  test('returns null when even the system message and the prompt do not fit', () => {
    const messages = [{ role: 'system', content: 'z'.repeat(4000) } as const, P, A1, big('c1', 8000)];
    expect(compactTranscript(messages, 500)).toBeNull();
  });

  test('refuses an unsound transcript rather than shrinking it', () => {
    expect(compactTranscript([S, P, A1, big('c1', 8000), ask(call('c2'))], 100)).toBeNull();
  });

  test('does not stub a result whose stub would be longer, nor stub a stub again', () => {
    const toolCharacters = (messages: readonly ChatMessage[]): number =>
      messages.reduce((sum, message) => sum + (message.role === 'tool' ? message.content.length : 0), 0);
    // The stubbed group sits before the prompt, so it can only be stubbed, never dropped.
    const messages = [S, earlier, A1, stubbed('c1', 9000), P, A2, result('c2', 'ok')];
    // Re-stubbing the stub would save 2 characters and fit; lengthening 'ok' would not help. Neither may happen.
    expect(compactTranscript(messages, toolCharacters(messages) - 1, toolCharacters)).toBeNull();
    expect(compactTranscript(messages, toolCharacters(messages), toolCharacters)).toEqual(messages);
  });

  test('uses the estimator it is given', () => {
    const count = (messages: readonly ChatMessage[]): number => messages.length;
    const messages = [S, P, A1, T1, A2, T2, ask(call('c3')), T3];
    // 8 messages, target 6: short results are not worth a stub, so the oldest group after the prompt goes.
    expect(compactTranscript(messages, 6, count)).toEqual([S, P, A2, T2, ask(call('c3')), T3]);
  });

  test('leaves its input untouched', () => {
    const messages = [S, P, A1, big('c1', 4000), A2, big('c2', 4000)];
    const before = structuredClone(messages);
    compactTranscript(messages, 50);
    expect(messages).toEqual(before);
  });
});

describe('citation numbering in a thread', () => {
  const source = (number: number, url: string, title = `Title ${number}`): NumberedSource => ({ url, title, passage: 'p', fetchedAt: '2026-01-01T00:00:00.000Z', number });
  const sourced = (id: string, sources: NumberedSource[]): ChatMessage => ({ role: 'tool', toolCallId: id, name: 'search', content: `result of ${id}${citationKey(sources)}`, sources });

  test('compaction replaces text, not sources: numbering goes on from the highest recorded number, a URL seen before (fragment aside) keeps its number', () => {
    const thread = [S, P, ask(call('c1')), sourced('c1', [source(1, 'https://a.example/'), source(2, 'https://b.example/')]), ask(call('c2')), sourced('c2', [source(3, 'https://c.example/')])];
    const compacted = compactTranscript(thread, estimateTokens(thread) - 30);
    expect(compacted).not.toBeNull();
    expect(compacted?.find((message) => message.role === 'tool' && message.toolCallId === 'c2')).toMatchObject({ sources: [source(3, 'https://c.example/')] });
    const next = numberSources(compacted ?? [], [{ url: 'https://c.example/#part', title: 'C again', passage: 'q', fetchedAt: 'x' }, { url: 'https://d.example/', title: 'D', passage: 'q', fetchedAt: 'x' }]);
    expect(next.map((entry) => [entry.url, entry.number])).toEqual([
      ['https://c.example/#part', 3],
      ['https://d.example/', 4],
    ]);
  });

  test('warm repair keeps the kept results with their sources', () => {
    const T = sourced('c1', [source(1, 'https://a.example/')]);
    const repaired = repairForWarmRetry([S, P, ask(call('c1')), T, user('stray')], 'p1');
    expect(repaired.sound && repaired.messages[3]).toBe(T);
    expect(threadSources(repaired.sound ? repaired.messages : [])).toEqual([source(1, 'https://a.example/')]);
  });

  test('the key survives titles and URLs that would break a line, and parses back', () => {
    const awkward = [source(1, 'https://a.example/x y<z>', 'Two\nlines "quoted" <b>'), source(2, 'https://b.example/(p)')];
    const content = `{"results":[]}${citationKey(awkward)}`;
    expect(splitCitationKey(content)).toEqual({
      body: '{"results":[]}',
      entries: [
        { number: 1, title: 'Two lines "quoted" <b>', url: 'https://a.example/x%20y%3Cz%3E' },
        { number: 2, title: 'Title 2', url: 'https://b.example/(p)' },
      ],
    });
    expect(splitCitationKey('no key here')).toEqual({ body: 'no key here', entries: [] });
  });

  test('withoutSources leaves only what a provider may see', () => {
    const T = sourced('c1', [source(1, 'https://a.example/')]);
    expect(withoutSources(T)).toEqual({ role: 'tool', toolCallId: 'c1', name: 'search', content: T.content });
    expect(withoutSources(P)).toBe(P);
  });
});
