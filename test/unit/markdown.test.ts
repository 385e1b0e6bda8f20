/**
 * The chat page's report renderer (web/src/markdown.ts). Reports are model output: whatever HTML,
 * link scheme or entity trick a model writes must come out as inert text. Each output is parsed
 * with a DOM (linkedom) and checked element by element, rather than matched as a string, so a
 * payload that survives in an unexpected shape is still caught.
 */
import { parseHTML } from 'linkedom';
import { isWebUrl, renderMarkdown } from '../../web/src/markdown';

/** The part of linkedom's DOM these checks use (this project compiles without the DOM library). */
interface ParsedElement {
  readonly localName: string;
  readonly textContent: string | null;
  readonly attributes: ArrayLike<{ readonly name: string; readonly value: string }>;
  readonly children: ArrayLike<ParsedElement>;
  getAttribute(name: string): string | null;
  querySelector(selector: string): ParsedElement | null;
  querySelectorAll(selector: string): ArrayLike<ParsedElement>;
}
const parseDocument = parseHTML as unknown as (html: string) => { readonly document: { getElementById(id: string): ParsedElement | null } };

/** What markdown-it builds for the Markdown reports use, and what this renderer adds. */
const ALLOWED_TAGS = new Set(['p', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'ul', 'ol', 'li', 'a', 'strong', 'em', 's', 'code', 'pre', 'blockquote', 'hr', 'br', 'table', 'thead', 'tbody', 'tr', 'th', 'td', 'span']);
const ALLOWED_ATTRIBUTES = new Set(['href', 'title', 'target', 'rel', 'class', 'style', 'start']);

interface Rendered {
  readonly root: ParsedElement;
  readonly links: readonly ParsedElement[];
}

function rendered(markdown: string): Rendered {
  const { document } = parseDocument(`<!doctype html><html><body><div id="root">${renderMarkdown(markdown)}</div></body></html>`);
  const root = document.getElementById('root');
  if (!root) throw new Error('no root element');
  return { root, links: Array.from(root.querySelectorAll('a')) };
}

/** Every element and attribute is one the renderer means to write, and every link is a safe http(s) one. */
function expectInert({ root, links }: Rendered): void {
  for (const element of Array.from(root.querySelectorAll('*'))) {
    expect(ALLOWED_TAGS).toContain(element.localName);
    for (const attribute of Array.from(element.attributes)) {
      expect(attribute.name).not.toMatch(/^on/i);
      expect(ALLOWED_ATTRIBUTES).toContain(attribute.name);
      if (attribute.name === 'style') expect(attribute.value).toMatch(/^text-align:(left|right|center)$/);
    }
  }
  for (const link of links) {
    const href = link.getAttribute('href') ?? '';
    expect(href).toMatch(/^https?:\/\//);
    expect(new URL(href).protocol).toMatch(/^https?:$/);
    expect(link.getAttribute('rel')).toBe('noopener noreferrer');
    expect(link.getAttribute('target')).toBe('_blank');
  }
}

describe('model-written HTML and links come out inert', () => {
  const payloads: readonly (readonly [string, string])[] = [
    ['a script block', '<script>window.__pwned = 1</script>'],
    ['an inline script', 'Text <script>window.__pwned = 1</script> more'],
    ['an image with onerror', '<img src=x onerror="window.__pwned = 1">'],
    ['an svg with onload', '<svg onload="window.__pwned = 1"></svg>'],
    ['an iframe', '<iframe srcdoc="<script>parent.__pwned = 1</script>"></iframe>'],
    ['an HTML link to javascript:', '<a href="javascript:window.__pwned = 1">click</a>'],
    ['style, form, meta and base tags', '<style>body{display:none}</style><form action="https://evil.example"><input name=q></form><meta http-equiv="refresh" content="0;url=https://evil.example"><base href="https://evil.example/">'],
    ['a javascript: link', '[x](javascript:alert(1))'],
    ['an upper-case JAVASCRIPT: link', '[x](JAVASCRIPT:alert(1))'],
    ['a mixed-case link with spaces around it', '[x](  JaVaScRiPt:alert(1) )'],
    ['a javascript: link in angle brackets', '[x](<javascript:alert(1)>)'],
    ['a javascript: link behind a decimal entity', '[x](&#106;avascript:alert(1))'],
    ['a javascript: link behind a hex entity', '[x](&#x6A;avascript:alert(1))'],
    ['a javascript: link with an entity colon', '[x](javascript&#58;alert(1))'],
    ['a javascript: link with an escaped colon', '[x](javascript\\:alert(1))'],
    ['a data: URL', '[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)'],
    ['a data: image URL', '[x](data:image/svg+xml,<svg onload=alert(1)>)'],
    ['a vbscript: link', '[x](vbscript:msgbox(1))'],
    ['a file: link', '[x](file:///etc/passwd)'],
    ['a protocol-relative link', '[x](//evil.example/path)'],
    ['a relative link', '[x](/account/delete) and [y](../up) and [z](#top)'],
    ['a reference-style javascript: link', '[x][evil] and [evil]\n\n[evil]: javascript:alert(1)'],
    ['a reference-style data: link', '[x][d]\n\n[d]: data:text/html,<script>alert(1)</script>'],
    ['an autolink to javascript:', '<javascript:alert(1)>'],
    ['an autolink to data:', '<data:text/html,<script>alert(1)</script>>'],
    ['a bare javascript: URL', 'javascript:alert(1) and vbscript:msgbox(1)'],
    ['an image to javascript:', '![x](javascript:alert(1))'],
    ['an image whose alt text tries to close the attribute', '![x" onerror="alert(1)](https://example.com/p.png)'],
    ['a link title that tries to close the attribute', '[x](https://example.com "t\\" onmouseover=\\"alert(1)")'],
    ['a link label holding HTML', '[<img src=x onerror=alert(1)>](https://example.com)'],
    ['entity-encoded tags', '&lt;script&gt;alert(1)&lt;/script&gt; &#60;img src=x onerror=alert(1)&#62;'],
    ['a code fence whose info string tries to add an attribute', '```js" onclick="alert(1)\ncode\n```'],
    ['HTML in a table cell', '| a |\n|---|\n| <script>alert(1)</script> [x](javascript:alert(1)) |'],
    ['HTML in a citation definition title', 'See [1].\n\n[1]: https://example.com "<img src=x onerror=alert(1)>"'],
    ['a URL with a quote in it', '[x](https://example.com/"onmouseover="alert(1))'],
  ];

  test.each(payloads)('%s', (_name, markdown) => {
    expectInert(rendered(markdown));
  });

  test('all of them in one report', () => {
    expectInert(rendered(payloads.map(([, markdown]) => markdown).join('\n\n')));
  });

  test('the payloads stay visible as text: escaped, not dropped', () => {
    const { root } = rendered('Before <script>window.__pwned = 1</script> after [x](javascript:alert(1)) <img src=x onerror=alert(2)>');
    expect(root.querySelector('script, img')).toBeNull();
    expect(root.textContent).toBe('Before <script>window.__pwned = 1</script> after [x](javascript:alert(1)) <img src=x onerror=alert(2)>\n');
  });

  test('images are not loaded: an http(s) image becomes a link the reader may follow', () => {
    const { root, links } = rendered('![chart](https://example.com/chart.png)');
    expect(root.querySelector('img')).toBeNull();
    expect(links.map((link) => [link.textContent, link.getAttribute('href')])).toEqual([['chart', 'https://example.com/chart.png']]);
  });

  test('isWebUrl accepts only absolute http(s) URLs', () => {
    expect(['https://example.com', 'http://example.com/a?b=1', 'HTTPS://EXAMPLE.COM'].map(isWebUrl)).toEqual([true, true, true]);
    expect(['javascript:alert(1)', 'data:text/html,x', '//example.com', '/path', 'https:/example.com', 'http:javascript:alert(1)', 'mailto:a@b.c', ''].map(isWebUrl)).toEqual([
      false,
      false,
      false,
      false,
      false,
      false,
      false,
      false,
    ]);
  });
});

describe('what reports use renders', () => {
  test('headings, paragraphs, lists and emphasis, as before', () => {
    const { root } = rendered(['# Report', '', '*Perspectives: a; b.*', '', '## Background', 'First line', 'continues here.', '', '- one', '- two', '', '**bold** and `code`'].join('\n'));
    expect(Array.from(root.children).map((element) => element.localName)).toEqual(['h1', 'p', 'h2', 'p', 'ul', 'p']);
    expect(root.querySelector('p em')?.textContent).toBe('Perspectives: a; b.');
    expect(root.querySelectorAll('p')[1]?.textContent).toBe('First line\ncontinues here.');
    expect(root.querySelector('strong')?.textContent).toBe('bold');
    expect(root.querySelector('code')?.textContent).toBe('code');
    expect(rendered('a snake_case_name and 2 * 3 * 4').root.textContent).toBe('a snake_case_name and 2 * 3 * 4\n');
  });

  test('tables, with their alignment', () => {
    const { root } = rendered(['| Source | Year | Score |', '|:--|:-:|--:|', '| A | 2024 | 0.9 |', '| B | 2025 | 0.7 |'].join('\n'));
    expect(Array.from(root.querySelectorAll('th')).map((cell) => cell.textContent)).toEqual(['Source', 'Year', 'Score']);
    expect(Array.from(root.querySelectorAll('tbody tr')).map((row) => Array.from(row.querySelectorAll('td')).map((cell) => cell.textContent))).toEqual([
      ['A', '2024', '0.9'],
      ['B', '2025', '0.7'],
    ]);
    expect(root.querySelector('th:last-child')?.getAttribute('style')).toBe('text-align:right');
  });

  test('nested lists', () => {
    const { root } = rendered(['- outer', '  - inner', '    1. deepest', '- second'].join('\n'));
    expect(root.querySelector('ul > li > ul > li > ol > li')?.textContent).toBe('deepest');
    expect(root.querySelectorAll(':scope > ul > li')).toHaveLength(2);
  });

  test('citations with reference definitions: inline [n] links to the source, and the definitions are listed at the end', () => {
    const report = ['Retries need idempotency keys [1], and leases need fencing [2].', '', '[1]: https://example.com/keys "Idempotency keys"', '[2]: https://example.org/fencing'].join('\n');
    const result = rendered(report);
    expectInert(result);
    const citations = Array.from(result.root.querySelectorAll('p a.citation')).map((link) => [link.textContent, link.getAttribute('href')]);
    expect(citations).toEqual([
      ['[1]', 'https://example.com/keys'],
      ['[2]', 'https://example.org/fencing'],
    ]);
    expect(result.root.querySelector('h2')?.textContent).toBe('References');
    const references = Array.from(result.root.querySelectorAll('ul.references li')).map((item) => [item.textContent, item.querySelector('a')?.getAttribute('href')]);
    expect(references).toEqual([
      ['[1] Idempotency keys', 'https://example.com/keys'],
      ['[2] https://example.org/fencing', 'https://example.org/fencing'],
    ]);
  });

  test('citations with a References list: inline [n] links to the entry\'s URL, and the list is shown once', () => {
    const report = [
      'Leases expire [1]; sweepers reclaim [2] and [3].',
      '',
      '## References',
      '',
      '1. Leases, 2024 — https://example.com/leases',
      '2. [Sweepers](https://example.org/sweep "Sweepers")',
      '3. Unsafe <javascript:alert(1)> only',
    ].join('\n');
    const result = rendered(report);
    expectInert(result);
    const citations = Array.from(result.root.querySelectorAll('p a.citation')).map((link) => [link.textContent, link.getAttribute('href')]);
    expect(citations).toEqual([
      ['[1]', 'https://example.com/leases'],
      ['[2]', 'https://example.org/sweep'],
    ]);
    // [3] names an entry with no web link: it stays text.
    expect(result.root.querySelector('p')?.textContent).toContain('and [3].');
    expect(Array.from(result.root.querySelectorAll('ol > li a')).map((link) => link.getAttribute('href'))).toEqual(['https://example.com/leases', 'https://example.org/sweep']);
    expect(result.root.querySelectorAll('h2')).toHaveLength(1);
    expect(result.root.querySelector('ul.references')).toBeNull();
  });

  test('a definition does not replace the report\'s own References list, and a [n] the report defines wins over the list', () => {
    const report = ['Cited [1].', '', '## Sources', '', '- [1] Other — https://example.org/listed', '', '[1]: https://example.com/defined'].join('\n');
    const { root } = rendered(report);
    expect(root.querySelector('p a.citation')?.getAttribute('href')).toBe('https://example.com/defined');
    expect(root.querySelector('ul.references')).toBeNull();
  });
});
