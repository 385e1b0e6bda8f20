/** The chat page's live report (web/src/research-view.ts): finished report sections in order, drafts of sections in flight. */
import { readDraft, readSection, type DraftView, type SectionView } from '../../client';
import { liveReport } from '../../web/src/research-view';

const finalSection = (id: string, seq: number, text: string, missing = false): SectionView =>
  readSection({ phase: 'final-document', unit: null, id, seq, data: { headingId: id, heading: `Heading ${id}`, text, sources: [], missing, note: null } });
const expertSection = (unit: string, id: string): SectionView => readSection({ phase: 'expert-content', unit, id, seq: 0, data: { skipped: false, headingId: id, text: 'notes', sources: [] } });
const draft = (phase: string, unit: string | null, id: string, text: string): DraftView => readDraft({ phase, unit, id, text, epoch: 2, updatedAtMs: 1 });

describe('live report', () => {
  it('shows finished report sections in the order they were recorded, leaving out missing ones and expert notes', () => {
    const report = liveReport(
      { status: 'running', phase: 'final-document', epoch: 2 },
      [finalSection('h3', 2, 'Third'), expertSection('e1', 'h1'), finalSection('h1', 0, 'First'), finalSection('h2', 1, '', true)],
      [],
    );
    expect(report.finished).toEqual([
      { key: 'final-document//h1', heading: 'Heading h1', text: 'First', sources: [] },
      { key: 'final-document//h3', heading: 'Heading h3', text: 'Third', sources: [] },
    ]);
  });

  it("carries a section's sources numbered as its [k] markers cite them; malformed entries read as blanks, never a crash", () => {
    const cited = readSection({
      phase: 'final-document',
      unit: null,
      id: 'h1',
      seq: 0,
      data: { headingId: 'h1', heading: 'Leases', text: 'Leases expire [1]; fencing tokens order writes [2].', sources: [{ url: 'https://a.example/lease', title: 'Leases', passage: 'p', fetchedAt: 't' }, { title: 42 }], missing: false, note: null },
    });
    expect(liveReport({ status: 'running', phase: 'final-document', epoch: 1 }, [cited], []).finished[0]?.sources).toEqual([
      { number: 1, title: 'Leases', url: 'https://a.example/lease' },
      { number: 2, title: '', url: '' },
    ]);
  });

  it('shows the drafts of the current phase for sections not finished yet, in section order', () => {
    const report = liveReport(
      { status: 'running', phase: 'expert-content', epoch: 2 },
      [expertSection('e1', 'h1')],
      [
        draft('expert-content', 'e1', 'h1', 'finished already'),
        draft('expert-content', 'e2', 'h10', 'ten'),
        draft('expert-content', 'e2', 'h2', 'two'),
        draft('outline', null, 'outline', 'an earlier phase'),
        draft('expert-content', 'e1', 'h2', '   '),
      ],
    );
    expect(report.writing).toEqual([
      { key: 'expert-content/e2/h2', label: 'e2 · h2', text: 'two' },
      { key: 'expert-content/e2/h10', label: 'e2 · h10', text: 'ten' },
    ]);
  });

  it('shows no draft once the job is not running', () => {
    for (const status of ['completed', 'failed', 'cancelled', 'waiting', 'queued'] as const) {
      expect(liveReport({ status, phase: 'final-document', epoch: 2 }, [], [draft('final-document', null, 'h1', 'half')]).writing).toEqual([]);
    }
  });

  it("hides a draft from an older claim than the job's or its unit's latest (a worker that lost its claim)", () => {
    const zombie = (unit: string | null, epoch: number): DraftView => readDraft({ phase: 'expert-content', unit, id: 'h1', text: `epoch ${epoch}`, epoch, updatedAtMs: 1 });
    const report = liveReport({ status: 'running', phase: 'expert-content', epoch: 7 }, [], [zombie(null, 3), zombie('e1', 2), zombie('e2', 5)], [
      { unit: 'e1', epoch: 4 },
      { unit: 'e2', epoch: 5 },
    ]);
    expect(report.writing.map((draft) => draft.text)).toEqual(['epoch 5']);
  });

  it('reads defensively: a document of another shape shows nothing and breaks nothing', () => {
    const odd = readSection({ phase: 'final-document', seq: 'x', data: 'not an object' });
    expect(liveReport({ status: 'running', phase: 'final-document', epoch: 2 }, [odd], [readDraft(null)])).toEqual({ finished: [], writing: [] });
  });
});
