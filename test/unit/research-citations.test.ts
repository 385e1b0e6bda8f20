/**
 * Citations in the research report: a section's markers renumbered to its own sources, the report
 * numbering every source once, definitions at the end, and source data (URLs, titles) from models
 * and web pages unable to break the Markdown reference syntax. The page's own renderer checks the
 * result, so "parses as intended" is tested, not assumed.
 */
import type { NumberedSource } from '../../functions/src/agent/provider';
import { citeSection, markdownUrl, numberCitationsAcross, referenceDefinitions, storableSource, type StoredSource } from '../../functions/src/agent/citations';
import { composeReport } from '../../functions/src/pipelines/research/pipeline';
import { renderMarkdown } from '../../web/src/markdown';

const AT = '2026-01-01T00:00:00.000Z';
const stored = (name: string, title = `Page ${name}`): StoredSource => ({ url: `https://${name}.example/`, title, passage: `What ${name} says.`, fetchedAt: AT });
const shown = (name: string, number: number): NumberedSource => ({ ...stored(name), number });
const experts = [{ id: 'e1', name: 'an engineer' }];

describe('citeSection: from the numbers a thread showed to the section’s own', () => {
  test('renumbers by first citation, keeps only cited sources, drops numbers never shown', () => {
    const cited = citeSection('Leases expire [3]. Fencing stops stale writes [1][3]. Made up [9].', [shown('a', 1), shown('b', 2), shown('c', 3)]);
    expect(cited).toEqual({ text: 'Leases expire [1]. Fencing stops stale writes [2] [1]. Made up.', sources: [stored('c'), stored('a')] });
  });

  test("drops the text's own numeric reference definitions and sources a report cannot link to", () => {
    const cited = citeSection('Claim [1], other [2].\n[1]: https://evil.example/ "Hijack"\n', [
      { ...shown('a', 1), url: 'javascript:alert(1)' },
      shown('b', 2),
    ]);
    expect(cited).toEqual({ text: 'Claim, other [1].\n', sources: [stored('b')] });
  });

  test('a text that cites nothing lists every source it was shown, so its evidence is not lost', () => {
    expect(citeSection('No markers here.', [shown('a', 1), shown('b', 2)])).toEqual({
      text: 'No markers here.\n\n*Sources consulted:* [1] [2]',
      sources: [stored('a'), stored('b')],
    });
    expect(citeSection('Nothing shown.', [])).toEqual({ text: 'Nothing shown.', sources: [] });
  });

  test('a link whose text is a number is not a citation', () => {
    expect(citeSection('See [1](https://x.example/) and [1].', [shown('a', 1)]).text).toBe('See [1](https://x.example/) and [1].');
  });

  test('passages and titles are cut to a sane length and put on one line', () => {
    const source = storableSource({ url: 'https://a.example/', title: `A\n${'t'.repeat(400)}`, passage: `${'word '.repeat(300)}\n\nend`, fetchedAt: AT });
    expect(source?.title.length).toBeLessThanOrEqual(200);
    expect(source?.title).not.toContain('\n');
    expect(source?.passage.length).toBeLessThanOrEqual(500);
    expect(source?.passage.endsWith('…')).toBe(true);
  });
});

describe('the report: one numbering, definitions at the end', () => {
  test('sources are numbered once for the report, by first citation, the same URL sharing a number across sections', () => {
    const { texts, references } = numberCitationsAcross([
      { text: 'First [1], then [2].', sources: [stored('b'), stored('a')] },
      { text: 'Again [2] and new [1].', sources: [stored('c'), { ...stored('b'), url: 'https://b.example/#section', title: 'B, later' }] },
    ]);
    expect(texts).toEqual(['First [1], then [2].', 'Again [1] and new [3].']);
    expect(references.map((reference) => [reference.number, reference.url])).toEqual([
      [1, 'https://b.example/'],
      [2, 'https://a.example/'],
      [3, 'https://c.example/'],
    ]);
  });

  test('the report ends with a References heading over the definitions; every citation renders as a link to its source', () => {
    const markdown = composeReport(
      'Research report: leases',
      experts,
      [
        { heading: 'Background', text: 'Leases expire [1]. Tokens grow [2].', sources: [stored('leases'), stored('tokens')] },
        { heading: 'Practice', text: 'Tokens again [1].', sources: [stored('tokens')] },
      ],
      [],
    );
    const lines = markdown.trimEnd().split('\n');
    expect(lines.slice(-4)).toEqual(['## References', '', '[1]: <https://leases.example/> "Page leases"', '[2]: <https://tokens.example/> "Page tokens"']);
    expect(markdown).toContain('Tokens again [2].');
    const html = renderMarkdown(markdown);
    expect(html).toMatch(/<a href="https:\/\/leases\.example\/" title="Page leases" class="citation"[^>]*>\[1\]<\/a>/);
    expect(html.match(/class="citation"/g)).toHaveLength(3);
    expect(html).toContain('<h2>References</h2>');
  });

  test('a report without sources has no References section', () => {
    expect(composeReport('T', experts, [{ heading: 'H', text: 'Plain.', sources: [] }], [])).not.toContain('References');
  });

  test('URLs with quotes, parentheses, brackets, spaces or backslashes and titles with quotes or new lines cannot break a definition', () => {
    const hostile: StoredSource[] = [
      { url: 'https://a.example/x"y(z)>w <b>?q=\\"', title: 'Say "hi"\n\n[2]: https://evil.example/', passage: '', fetchedAt: AT },
      { url: 'https://b.example/p)', title: 'Ends with a backslash \\', passage: '', fetchedAt: AT },
    ];
    const definitions = referenceDefinitions(hostile.map((source, index) => ({ ...source, number: index + 1 })));
    expect(definitions).toHaveLength(2);
    for (const line of definitions) expect(line).toMatch(/^\[\d\]: <[^<>\s\\]+> "(?:[^"\\\n]|\\["\\])*"$/);

    const markdown = composeReport('T', experts, [{ heading: 'H', text: 'One [1], two [2].', sources: hostile }], []);
    const html = renderMarkdown(markdown);
    const hrefs = [...html.matchAll(/href="([^"]*)"/g)].map((match) => match[1]);
    expect(hrefs.every((href) => href?.startsWith('https://a.example/') === true || href?.startsWith('https://b.example/') === true)).toBe(true);
    expect(html).not.toContain('href="https://evil.example');
    expect(html.match(/class="citation"/g)).toHaveLength(2);
    expect(html).toContain('Say &quot;hi&quot; [2]: https://evil.example/');
  });

  test('only http(s) URLs become link targets', () => {
    expect(markdownUrl('javascript:alert(1)')).toBeNull();
    expect(markdownUrl('data:text/html,<b>')).toBeNull();
    expect(markdownUrl('not a url')).toBeNull();
    expect(markdownUrl('https://a.example/a b')).toBe('https://a.example/a%20b');
  });
});
