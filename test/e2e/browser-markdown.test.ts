/**
 * The chat page's Markdown renderer (web/src/markdown.ts): reports are model output, so every
 * piece of text must come out escaped, whatever it contains. A pure test; it sits with the browser
 * test because it covers what the page puts into innerHTML.
 */
import { escapeHtml, renderInline, renderMarkdown } from '../../web/src/markdown';

test('escapes HTML in every position: text, headings, list items, emphasis, code and quotes', () => {
  const hostile = [
    '# <script>alert(1)</script> title',
    '',
    'Text with <img src=x onerror="alert(2)"> and **<b>bold</b>** and `<code>`.',
    '',
    '- item <iframe src="javascript:alert(3)">',
    '1. first & "second"',
    '',
    '> quoted <svg onload=alert(4)>',
    '',
    '```',
    '<script>not code</script>',
    '```',
  ].join('\n');
  const html = renderMarkdown(hostile);
  expect(html).not.toMatch(/<(script|img|iframe|svg|b)\b/i);
  expect(html).toContain('<h1>&lt;script&gt;alert(1)&lt;/script&gt; title</h1>');
  expect(html).toContain('<p>Text with &lt;img src=x onerror=&quot;alert(2)&quot;&gt; and <strong>&lt;b&gt;bold&lt;/b&gt;</strong> and <code>&lt;code&gt;</code>.</p>');
  expect(html).toContain('<ul><li>item &lt;iframe src=&quot;javascript:alert(3)&quot;&gt;</li></ul>');
  expect(html).toContain('<ol><li>first &amp; &quot;second&quot;</li></ol>');
  expect(html).toContain('<blockquote><p>quoted &lt;svg onload=alert(4)&gt;</p></blockquote>');
  expect(html).toContain('<pre><code>&lt;script&gt;not code&lt;/script&gt;</code></pre>');
});

test('renders the structure reports use: headings, paragraphs, lists, emphasis', () => {
  const html = renderMarkdown(
    ['# Report', '', '*Perspectives: a; b.*', '', '## Background', 'First line', 'continues here.', '', '- one', '- two', '', '## Missing from this report', '', '- e1 · Outlook'].join('\n'),
  );
  expect(html.split('\n')).toEqual([
    '<h1>Report</h1>',
    '<p><em>Perspectives: a; b.</em></p>',
    '<h2>Background</h2>',
    '<p>First line continues here.</p>',
    '<ul><li>one</li><li>two</li></ul>',
    '<h2>Missing from this report</h2>',
    '<ul><li>e1 · Outlook</li></ul>',
  ]);
});

test('links only to http(s), never javascript:, and leaves snake_case and lone asterisks alone', () => {
  expect(renderInline('[docs](https://example.com/a?b=1&c=2)')).toBe('<a href="https://example.com/a?b=1&amp;c=2" rel="noopener noreferrer" target="_blank">docs</a>');
  expect(renderInline('[click](javascript:alert(1))')).toBe('[click](javascript:alert(1))');
  expect(renderInline('a snake_case_name and 2 * 3 * 4')).toBe('a snake_case_name and 2 * 3 * 4');
  expect(renderInline('_em_ and __strong__')).toBe('<em>em</em> and <strong>strong</strong>');
  expect(escapeHtml(`<>&"'`)).toBe('&lt;&gt;&amp;&quot;&#39;');
});
