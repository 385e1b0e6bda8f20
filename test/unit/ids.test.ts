import { z } from 'zod';
import { documentId, documentIdProblem, firestoreRefusal, isDocumentId, MAX_ID_LENGTH } from '../../functions/src/core/ids';

/** Short test names for long IDs. */
const label = (id: unknown): string => (typeof id === 'string' && id.length > 24 ? `${JSON.stringify(id.slice(0, 6))}… (${id.length} characters)` : JSON.stringify(id));
const labelled = <T extends unknown[]>(rows: readonly [unknown, ...T][]): [string, unknown, ...T][] => rows.map(([id, ...rest]) => [label(id), id, ...rest]);

describe('firestoreRefusal: the IDs Firestore itself refuses', () => {
  test.each(
    labelled<[RegExp]>([
      ['', /empty/],
      ['.', /"\."/],
      ['..', /"\.\."/],
      ['__x__', /__name__/],
      ['____', /__name__/],
      ['__.__', /__name__/],
      ['__a\nb__', /__name__/],
      ['a/b', /"\/"/],
      ['/', /"\/"/],
      ['\uD800', /not valid Unicode/],
      ['a\uDC00b', /not valid Unicode/],
      ['x'.repeat(1501), /1501 bytes long; Firestore allows at most 1500/],
      ['é'.repeat(751), /1502 bytes long/],
    ]),
  )('bug 6: refuses %s', (_name, id, reason) => {
    expect(firestoreRefusal(id as string)).toMatch(reason);
  });

  test.each(labelled([['a'], ['...'], ['.a'], ['a.'], ['__'], ['___'], ['__a'], ['a__'], ['_x_'], ['x'.repeat(1500)], ['é'.repeat(750)], ['\uD83D\uDE00']]))(
    'bug 6: accepts %s',
    (_name, id) => {
      expect(firestoreRefusal(id as string)).toBeNull();
    },
  );
});

describe('documentId: IDs from outside', () => {
  const accepted = ['a', 'kd3a9', 'AbC-1_2', '__', '___', '__a', 'a__', '_x_', 'x'.repeat(MAX_ID_LENGTH)];
  const refused: [unknown, RegExp][] = [
    ['__x__', /jobId has the form __name__, which is reserved by Firestore/],
    ['____', /jobId has the form __name__/],
    ['__0123456789__', /jobId has the form __name__/],
    ['.', /jobId must be 1 to 128 letters/],
    ['..', /jobId must be 1 to 128 letters/],
    ['../x', /jobId must be 1 to 128 letters/],
    ['a/b', /jobId must be 1 to 128 letters/],
    ['', /jobId must not be empty/],
    ['x'.repeat(MAX_ID_LENGTH + 1), /jobId must be 1 to 128 letters, digits, "_" or "-" \(it is 129 characters long\)/],
    ['é', /jobId must be 1 to 128 letters/],
    [42, /jobId must be a string/],
    [null, /jobId must be a string/],
  ];

  test.each(labelled(accepted.map((id) => [id] as [string])))('bug 6: accepts %s', (_name, id) => {
    expect(documentId('jobId').parse(id)).toBe(id);
    expect(isDocumentId(id)).toBe(true);
    expect(documentIdProblem(id as string)).toBeNull();
  });

  test.each(labelled(refused))('bug 6: refuses %s with a readable message', (_name, id, message) => {
    const parsed = z.strictObject({ jobId: documentId('jobId') }).safeParse({ jobId: id });
    expect(parsed.success).toBe(false);
    if (!parsed.success) expect(z.prettifyError(parsed.error)).toMatch(message);
    expect(isDocumentId(id)).toBe(false);
  });

  test('bug 6: it never accepts an ID Firestore refuses', () => {
    const candidates = [...accepted, ...refused.map(([value]) => value), '__', '.', '..', 'a/b', '\uD800', 'x'.repeat(1501)];
    for (const id of candidates) if (isDocumentId(id)) expect(firestoreRefusal(id)).toBeNull();
  });

  test('bug 6: the message does not repeat the ID, so a huge one cannot make the rejection record too large', () => {
    const huge = `__${'x'.repeat(1_000_000)}__`;
    expect((documentIdProblem(huge) ?? '').length).toBeLessThan(200);
  });
});
