/** The corpus toolbox: deterministic search and read, readable failures instead of throws, execution counts, partial results. */
import type { ToolCall } from '../../functions/src/agent/provider';
import { RetryableError } from '../../functions/src/core/errors';
import { CORPUS, CORPUS_TOOL_SPECS, ToolInterruptedError, createCorpusToolbox } from '../../functions/src/providers/offline';
import { groupCallId } from '../../functions/src/providers/offline/toolbox';

const signal = new AbortController().signal;

function call(name: string, args: unknown, id = `id-${name}-${JSON.stringify(args)}`): ToolCall {
  return { id, name, arguments: typeof args === 'string' ? args : JSON.stringify(args) };
}

interface Hit {
  id: string;
  title: string;
  snippet: string;
  score: number;
}

function hitsOf(content: string): Hit[] {
  return (JSON.parse(content) as { results: Hit[] }).results;
}

describe('bundled corpus', () => {
  it('holds 12 to 20 documents with unique ids, titles and a few paragraphs each', () => {
    expect(CORPUS.length).toBeGreaterThanOrEqual(12);
    expect(CORPUS.length).toBeLessThanOrEqual(20);
    expect(new Set(CORPUS.map((document) => document.id)).size).toBe(CORPUS.length);
    expect(new Set(CORPUS.map((document) => document.title)).size).toBe(CORPUS.length);
    for (const document of CORPUS) {
      expect(document.id).toMatch(/^[a-z0-9-]+$/);
      expect(document.text.split(/\n\s*\n/).length).toBeGreaterThanOrEqual(3);
    }
  });
});

describe('corpus toolbox', () => {
  it('describes its tools with JSON Schemas of their arguments', () => {
    expect(CORPUS_TOOL_SPECS.map((spec) => spec.name)).toEqual(['search', 'read']);
    expect(CORPUS_TOOL_SPECS[0]!.parameters).toMatchObject({ type: 'object', required: ['query'], additionalProperties: false });
    expect(CORPUS_TOOL_SPECS[1]!.parameters).toMatchObject({ type: 'object', required: ['id'] });
    expect(CORPUS_TOOL_SPECS[0]!.parameters).not.toHaveProperty('$schema');
  });

  it('search ranks by title and text terms, deterministically, with snippets', async () => {
    const toolbox = createCorpusToolbox();
    const first = await toolbox.execute(call('search', { query: 'fencing tokens for leases' }), signal);
    const again = await createCorpusToolbox().execute(call('search', { query: 'fencing tokens for leases' }), signal);
    expect(first.ok).toBe(true);
    expect(again.content).toBe(first.content);
    const hits = hitsOf(first.content);
    expect(hits[0]).toMatchObject({ id: 'leases-and-fencing', title: 'Leases and fencing tokens' });
    expect(hits[0]!.snippet.length).toBeGreaterThan(10);
    expect(CORPUS.find((document) => document.id === 'leases-and-fencing')!.text.replace(/\s+/g, ' ')).toContain(hits[0]!.snippet);
    const scores = hits.map((hit) => hit.score);
    expect([...scores].sort((left, right) => right - left)).toEqual(scores);
  });

  it('search honours limit and returns nothing for words the corpus lacks', async () => {
    const toolbox = createCorpusToolbox();
    expect(hitsOf((await toolbox.execute(call('search', { query: 'retry worker failure', limit: 2 }), signal)).content)).toHaveLength(2);
    expect(hitsOf((await toolbox.execute(call('search', { query: 'retry worker failure' }), signal)).content)).toHaveLength(5);
    expect(hitsOf((await toolbox.execute(call('search', { query: 'photosynthesis chlorophyll' }), signal)).content)).toEqual([]);
  });

  it('read returns the document, and a readable error for an unknown id', async () => {
    const toolbox = createCorpusToolbox();
    const found = await toolbox.execute(call('read', { id: 'sagas' }), signal);
    expect(found.ok).toBe(true);
    expect(JSON.parse(found.content)).toEqual(CORPUS.find((document) => document.id === 'sagas'));
    const missing = await toolbox.execute(call('read', { id: 'no-such-doc' }), signal);
    expect(missing.ok).toBe(false);
    expect(JSON.parse(missing.content)).toEqual({ error: 'No document with id "no-such-doc". Use search to find document ids.' });
  });

  it.each([
    ['search', '{"query": '],
    ['search', {}],
    ['search', { query: '   ' }],
    ['search', { query: 'lease', limit: 0 }],
    ['search', { query: 'lease', extra: true }],
    ['read', { id: 7 }],
    ['read', []],
  ])('bad arguments for %s (%j) give ok: false, not a throw', async (name, args) => {
    const result = await createCorpusToolbox().execute(call(name, args), signal);
    expect(result.ok).toBe(false);
    expect((JSON.parse(result.content) as { error: string }).error).toMatch(new RegExp(`arguments for ${name}`, 'i'));
  });

  it('an unknown tool gives ok: false naming the tools it has', async () => {
    const result = await createCorpusToolbox().execute(call('delete_everything', {}), signal);
    expect(result).toEqual({ ok: false, content: JSON.stringify({ error: 'Unknown tool "delete_everything". Available tools: search, read.' }) });
  });

  it('counts executions per tool name and per call ID', async () => {
    const toolbox = createCorpusToolbox();
    await toolbox.execute(call('search', { query: 'lease' }, 'a'), signal);
    await toolbox.execute(call('search', { query: 'lease' }, 'a'), signal);
    await toolbox.execute(call('read', { id: 'sagas' }, 'b'), signal);
    await toolbox.execute(call('read', '{bad', 'c'), signal);
    expect(toolbox.stats()).toEqual({ total: 4, byTool: { search: 2, read: 2 }, byCallId: { a: 2, b: 1, c: 1 }, deliveredByCallId: { a: 2, b: 1, c: 1 } });
    expect(toolbox.executionsOf('a')).toBe(2);
    expect(toolbox.executionsOf('never')).toBe(0);
  });

  it('refuses to run once the signal is aborted', async () => {
    const controller = new AbortController();
    const reason = new Error('claim lost');
    controller.abort(reason);
    const toolbox = createCorpusToolbox();
    await expect(toolbox.execute(call('search', { query: 'lease' }), controller.signal)).rejects.toBe(reason);
  });

  it('with partialToolResultsRate 1, interrupts the 2nd+ call of a group but never the 1st or a foreign call ID', async () => {
    const toolbox = createCorpusToolbox({ settings: { partialToolResultsRate: 1 }, seed: 3 });
    const group = 'abcdef0123456789';
    expect((await toolbox.execute(call('search', { query: 'lease' }, groupCallId(group, 0)), signal)).ok).toBe(true);
    const interrupted = toolbox.execute(call('search', { query: 'saga' }, groupCallId(group, 1)), signal);
    await expect(interrupted).rejects.toBeInstanceOf(ToolInterruptedError);
    await expect(interrupted).rejects.toBeInstanceOf(RetryableError);
    await expect(interrupted).rejects.toMatchObject({ retryable: true, callId: groupCallId(group, 1), toolName: 'search' });
    expect((await toolbox.execute(call('search', { query: 'saga' }, 'call_XYZ_1'), signal)).ok).toBe(true);
    expect(toolbox.executionsOf(groupCallId(group, 1))).toBe(1);
    // An interrupted execution counts as run, not as delivered.
    expect(toolbox.stats().deliveredByCallId[groupCallId(group, 1)]).toBeUndefined();
  });

  it('with a partial rate below 1, a retried call gets a fresh draw and the draws replay for a seed', async () => {
    const outcomes = async (seed: number): Promise<boolean[]> => {
      const toolbox = createCorpusToolbox({ settings: { partialToolResultsRate: 0.5 }, seed });
      const results: boolean[] = [];
      for (let attempt = 0; attempt < 16; attempt += 1) {
        results.push(await toolbox.execute(call('read', { id: 'sagas' }, groupCallId('0123456789abcdef', 1)), signal).then(
          () => true,
          (error: unknown) => {
            expect(error).toBeInstanceOf(ToolInterruptedError);
            return false;
          },
        ));
      }
      return results;
    };
    const first = await outcomes(11);
    expect(await outcomes(11)).toEqual(first);
    expect(first).toContain(true);
    expect(first).toContain(false);
  });
});
