/**
 * The append-only transcript log: what each save writes, and that replaying the saves gives back
 * exactly the transcript saved last, through appends, repairs that drop messages, clean threads,
 * values that are not message-shaped and a document from before the log. A log with a gap or a save
 * that keeps more than there was loads as an unreadable marker, never as a shorter transcript.
 */
import type { StoredDocument } from '../../functions/src/store/checkpoint-reads';
import { EMPTY_LOG, encodeSave, groupBySection, replaySaves, type SectionLogState } from '../../functions/src/store/transcript-log';

interface Transcript {
  generation: number;
  messages: { role: string; content: string }[];
  tally: { modelCalls: number };
}

const say = (role: string, content: string) => ({ role, content });

/** Saves each transcript in turn, as the durable writer does, and returns the documents written. */
function saveAll(transcripts: readonly unknown[], start: SectionLogState = EMPTY_LOG, id = 's1'): StoredDocument[] {
  let state = start;
  return transcripts.map((transcript) => {
    const { document, next } = encodeSave(state, transcript);
    state = next;
    return { id: `p~-~${id}~${String(next.save).padStart(6, '0')}`, data: { ...document, id } };
  });
}

const thread = (generation: number, ...messages: { role: string; content: string }[]): Transcript => ({ generation, messages, tally: { modelCalls: messages.length } });

describe('transcript log', () => {
  test('each save writes only what it appended; replaying the saves gives the last transcript', () => {
    const history = [
      thread(0, say('user', 'q')),
      thread(0, say('user', 'q'), say('assistant', 'call t1')),
      thread(0, say('user', 'q'), say('assistant', 'call t1'), say('tool', 'r1')),
      thread(0, say('user', 'q'), say('assistant', 'call t1'), say('tool', 'r1'), say('assistant', 'answer')),
    ];
    const saves = saveAll(history);
    expect(saves.map((save) => (save.data as { keep: number }).keep)).toEqual([0, 1, 2, 3]);
    expect(saves.map((save) => (save.data as { messages: unknown[] }).messages.length)).toEqual([1, 1, 1, 1]);
    // Every prefix of the log replays to the transcript saved at that point.
    history.forEach((transcript, index) => expect(replaySaves(saves.slice(0, index + 1)).transcript).toEqual(transcript));
    expect(replaySaves([...saves].reverse()).state.save).toBe(3);
  });

  test('a repair that drops messages keeps the unchanged prefix; a clean thread keeps nothing; replay follows both', () => {
    const history = [
      thread(0, say('user', 'q'), say('assistant', 'call t1'), say('tool', 'r1')),
      thread(0, say('user', 'q'), say('assistant', 'call t1')), // repaired: the last message dropped
      thread(0, say('user', 'q'), say('assistant', 'call t1'), say('tool', 'r1 again')),
      thread(1, say('user', 'fresh start')), // a clean thread
    ];
    const saves = saveAll(history);
    expect(saves.map((save) => (save.data as { keep: number }).keep)).toEqual([0, 2, 2, 0]);
    history.forEach((transcript, index) => expect(replaySaves(saves.slice(0, index + 1)).transcript).toEqual(transcript));
  });

  test('a value that is not message-shaped is stored whole, and a later message-shaped one starts over', () => {
    const history = [{ turns: ['a'] }, { turns: ['a', 'b'] }, thread(0, say('user', 'q'))];
    const saves = saveAll(history);
    expect(saves.map((save) => (save.data as { keep: unknown }).keep)).toEqual([null, null, 0]);
    history.forEach((transcript, index) => expect(replaySaves(saves.slice(0, index + 1)).transcript).toEqual(transcript));
  });

  test('a whole-transcript document from before the log is where the log starts', () => {
    const before = thread(0, say('user', 'q'), say('assistant', 'call t1'));
    const legacy: StoredDocument = { id: 'p~-~s1', data: { id: 's1', transcript: before } };
    const loaded = replaySaves([legacy]);
    expect(loaded).toEqual({ transcript: before, state: { save: 0, messageKeys: before.messages.map((message) => JSON.stringify(message)) } });
    const next = thread(0, say('user', 'q'), say('assistant', 'call t1'), say('tool', 'r1'));
    const saves = saveAll([next], loaded.state);
    expect(saves[0]?.data).toMatchObject({ save: 1, keep: 2, messages: [say('tool', 'r1')] });
    expect(replaySaves([legacy, ...saves]).transcript).toEqual(next);
  });

  test('a gap in the log, or a save keeping more than there was, loads as unreadable; a clean thread saved after it reads again', () => {
    const saves = saveAll([thread(0, say('user', 'q')), thread(0, say('user', 'q'), say('assistant', 'a')), thread(0, say('user', 'q'), say('assistant', 'a'), say('tool', 'r'))]);
    const gap = replaySaves([saves[0]!, saves[2]!]);
    expect(gap.transcript).toEqual({ unreadableTranscript: 'save 2 follows save 0' });
    // The next save is numbered past every save there is, so it cannot overwrite one.
    expect(gap.state).toEqual({ save: 2, messageKeys: null });

    const overKeeping = { ...saves[1]!, data: { ...(saves[1]!.data as object), keep: 5 } };
    expect(replaySaves([saves[0]!, overKeeping]).transcript).toEqual({ unreadableTranscript: 'save 1 is malformed or keeps 5 of 1 messages' });

    const fresh = thread(1, say('user', 'again'));
    const restarted = saveAll([fresh], gap.state);
    expect(replaySaves([saves[0]!, saves[2]!, ...restarted]).transcript).toEqual(fresh);
  });

  test('bytes written grow linearly with the section: a 200-turn thread', () => {
    const messages: { role: string; content: string }[] = [];
    const history: Transcript[] = [];
    for (let turn = 0; turn < 200; turn += 1) {
      messages.push(say(turn % 2 === 0 ? 'assistant' : 'tool', `turn ${turn} ${'x'.repeat(500)}`));
      history.push(thread(0, ...messages));
    }
    const saves = saveAll(history);
    const appendOnly = saves.reduce((sum, save) => sum + JSON.stringify(save.data).length, 0);
    const wholeEachTime = history.reduce((sum, transcript) => sum + JSON.stringify(transcript).length, 0);
    // Every turn is written once (plus a small head per save), where rewriting the whole thread writes turn k 200 - k times.
    expect(appendOnly).toBeLessThan(200 * 700);
    expect(wholeEachTime).toBeGreaterThan(50 * appendOnly);
    expect(replaySaves(saves).transcript).toEqual(history.at(-1));
  });

  test('documents are grouped by the section their id field names', () => {
    const a = saveAll([{ v: 1 }], EMPTY_LOG, 'a');
    const b = saveAll([{ v: 2 }, { v: 3 }], EMPTY_LOG, 'b');
    const groups = groupBySection([...a, ...b, { id: 'stray', data: { no: 'id' } }]);
    expect([...groups.keys()]).toEqual(['a', 'b']);
    expect(replaySaves(groups.get('b')!).transcript).toEqual({ v: 3 });
  });
});
