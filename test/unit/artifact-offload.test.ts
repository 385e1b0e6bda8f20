/**
 * The pure parts of artifacts and transcript offload, without Firestore: chunk and commit layout,
 * the hash and size check, the in-memory store, and a transcript save whose big contents go to
 * artifacts and come back whole, or make the transcript unreadable when they cannot.
 */
import { createMemoryArtifactStore } from '../../functions/src/agent/web/artifacts';
import { ArtifactUnreadableError, CHUNK_BYTES, chunkCountFor, commitGroups, sha256Hex, verifiedContent, type ArtifactStore } from '../../functions/src/store/artifact-store';
import type { StoredDocument } from '../../functions/src/store/checkpoint-reads';
import {
  EMPTY_LOG,
  encodeSave,
  loadSaves,
  offloadLargeContents,
  OFFLOAD_CONTENT_BYTES,
  replaySaves,
  SAVE_DOCUMENT_BUDGET_BYTES,
  type SectionLogState,
} from '../../functions/src/store/transcript-log';

const JOB = 'job-1';

describe('chunk layout', () => {
  test('chunks of CHUNK_BYTES, the last one shorter; none for empty content', () => {
    expect(chunkCountFor(0)).toBe(0);
    expect(chunkCountFor(1)).toBe(1);
    expect(chunkCountFor(CHUNK_BYTES)).toBe(1);
    expect(chunkCountFor(CHUNK_BYTES + 1)).toBe(2);
    expect(chunkCountFor(20 * 1024 * 1024)).toBe(40);
  });

  test('commit groups cover every chunk once, in order, each at most the per-commit count', () => {
    expect(commitGroups(0)).toEqual([]);
    expect(commitGroups(9, 4)).toEqual([[0, 1, 2, 3], [4, 5, 6, 7], [8]]);
    const groups = commitGroups(40);
    expect(groups.flat()).toEqual(Array.from({ length: 40 }, (_, index) => index));
    for (const group of groups) expect(group.length * CHUNK_BYTES).toBeLessThan(4 * 1024 * 1024);
  });
});

describe('the check on read', () => {
  const bytes = Buffer.from('the full text of a page');
  const ref = { sha256: sha256Hex(bytes), size: bytes.byteLength };

  test('chunks that join to the referenced bytes pass', () => {
    expect(verifiedContent(ref, [bytes.subarray(0, 5), bytes.subarray(5)])).toEqual({ ok: true, bytes });
  });

  test('a changed byte is a hash mismatch; a missing or extra byte is a size mismatch', () => {
    const changed = Buffer.from(bytes);
    changed[0] = 0x54;
    expect(verifiedContent(ref, [changed])).toMatchObject({ ok: false, fault: 'hash_mismatch' });
    expect(verifiedContent(ref, [bytes.subarray(1)])).toMatchObject({ ok: false, fault: 'size_mismatch' });
    expect(verifiedContent(ref, [bytes, Buffer.from('!')])).toMatchObject({ ok: false, fault: 'size_mismatch' });
  });
});

describe('the in-memory store', () => {
  test('content-addressed per job: the same bytes twice are written once; another job keeps its own', async () => {
    const store = createMemoryArtifactStore();
    const first = await store.put(JOB, 'same', { contentType: 'text/plain' });
    const second = await store.put(JOB, Buffer.from('same'), { contentType: 'text/plain' });
    const other = await store.put('job-2', 'same', { contentType: 'text/plain' });
    expect([first.written, second.written, other.written]).toEqual([true, false, true]);
    expect(second.ref).toEqual(first.ref);
    expect((await store.get(JOB, first.ref)).toString()).toBe('same');
  });

  test('a reference with another size, or to nothing, is refused with a typed error', async () => {
    const store = createMemoryArtifactStore();
    const { ref } = await store.put(JOB, 'abc', { contentType: 'text/plain' });
    await expect(store.get(JOB, { ...ref, size: 4 })).rejects.toMatchObject({ fault: 'size_mismatch' });
    await expect(store.get('job-2', ref)).rejects.toBeInstanceOf(ArtifactUnreadableError);
  });
});

const BIG = 'r'.repeat(OFFLOAD_CONTENT_BYTES + 1);
const head = { generation: 0, attempts: { warm: 0, cold: 0 } };
const toolResult = (id: string, content: string) => ({ role: 'tool', toolCallId: id, name: 'fetch_page', content });
const transcriptOf = (...messages: unknown[]) => ({ ...head, messages });

/** Saves each transcript in turn as the durable writes do, offloading before each "commit". */
async function saveAll(store: ArtifactStore, transcripts: readonly unknown[]): Promise<StoredDocument[]> {
  let state: SectionLogState = EMPTY_LOG;
  const documents: StoredDocument[] = [];
  for (const transcript of transcripts) {
    const encoded = encodeSave(state, transcript);
    documents.push({ id: `s~${encoded.next.save}`, data: await offloadLargeContents(encoded.document, store, JOB) });
    state = encoded.next;
  }
  return documents;
}

describe('transcript offload', () => {
  const small = { role: 'assistant', content: 'calling fetch_page' };

  test('a content over the threshold goes to an artifact; the save keeps a reference; loading restores it whole', async () => {
    const store = createMemoryArtifactStore();
    const transcript = transcriptOf(small, toolResult('c1', BIG));
    const [save] = await saveAll(store, [transcript]);
    const data = save!.data as Record<string, unknown>;
    expect(data.messages).toEqual([small, { ...toolResult('c1', ''), content: null }]);
    expect(data.offloaded).toEqual([{ index: 1, sha256: sha256Hex(Buffer.from(BIG)), size: BIG.length }]);
    expect(JSON.stringify(data).length).toBeLessThan(2_000);
    const loaded = await loadSaves([save!], store, JOB);
    expect(loaded.transcript).toEqual(transcript);
    // The state the next save builds on is the real content's: that save keeps the big message, it does not append it again.
    expect(encodeSave(loaded.state, transcriptOf(small, toolResult('c1', BIG), small)).document).toMatchObject({ keep: 2, messages: [small] });
  });

  test('a content at the threshold stays inline', async () => {
    const store = createMemoryArtifactStore();
    const atThreshold = 'r'.repeat(OFFLOAD_CONTENT_BYTES);
    const [save] = await saveAll(store, [transcriptOf(toolResult('c1', atThreshold))]);
    expect((save!.data as Record<string, unknown>).offloaded).toBeUndefined();
    expect(store.list()).toEqual([]);
  });

  test('several contents under the threshold that together pass the save budget: the largest go until it fits', async () => {
    const store = createMemoryArtifactStore();
    const pieces = [200, 220, 240, 180].map((kib, index) => toolResult(`c${index}`, String(index).repeat(kib * 1024)));
    const transcript = transcriptOf(...pieces);
    const [save] = await saveAll(store, [transcript]);
    const data = save!.data as { offloaded: { index: number }[] };
    expect(data.offloaded.map((entry) => entry.index)).toEqual([1, 2]);
    expect(JSON.stringify(data).length).toBeLessThanOrEqual(SAVE_DOCUMENT_BUDGET_BYTES);
    expect((await loadSaves([save!], store, JOB)).transcript).toEqual(transcript);
  });

  test('references survive later saves that keep the message, and are dropped with a clean thread', async () => {
    const store = createMemoryArtifactStore();
    const history = [transcriptOf(toolResult('c1', BIG)), transcriptOf(toolResult('c1', BIG), small), transcriptOf(small)];
    const saves = await saveAll(store, history);
    for (const [index, transcript] of history.entries()) expect((await loadSaves(saves.slice(0, index + 1), store, JOB)).transcript).toEqual(transcript);
  });

  test('a big whole value (not message-shaped) is offloaded and restored too', async () => {
    const store = createMemoryArtifactStore();
    const whole = { notes: BIG };
    const [save] = await saveAll(store, [whole]);
    expect(save!.data).toMatchObject({ keep: null, whole: null, wholeArtifact: { size: JSON.stringify(whole).length } });
    expect((await loadSaves([save!], store, JOB)).transcript).toEqual(whole);
  });

  test('a missing or altered artifact loads as the unreadable marker, never as a shorter thread', async () => {
    const store = createMemoryArtifactStore();
    const [save] = await saveAll(store, [transcriptOf(small, toolResult('c1', BIG))]);
    const missing = await loadSaves([save!], createMemoryArtifactStore(), JOB);
    expect(missing.transcript).toEqual({ unreadableTranscript: 'save 0: the offloaded content of message 1 is unreadable (missing)' });
    expect(missing.state).toEqual({ save: 0, messageKeys: null });
    store.list()[0]!.bytes[0] = 0x41;
    expect((await loadSaves([save!], store, JOB)).transcript).toEqual({ unreadableTranscript: 'save 0: the offloaded content of message 1 is unreadable (hash_mismatch)' });
  });

  test('a reference that points at a content left inline is malformed; the synchronous replay refuses offloaded logs', async () => {
    const store = createMemoryArtifactStore();
    const [save] = await saveAll(store, [transcriptOf(small, toolResult('c1', BIG))]);
    const data = save!.data as Record<string, unknown>;
    const pointingAtInline = { id: save!.id, data: { ...data, offloaded: [{ index: 0, sha256: 'x', size: 1 }] } };
    expect((await loadSaves([pointingAtInline], store, JOB)).transcript).toEqual({ unreadableTranscript: 'save 0 has a malformed list of offloaded contents' });
    expect(replaySaves([save!]).transcript).toEqual({ unreadableTranscript: 'the log has offloaded contents and was replayed without its artifact store' });
  });
});

describe('a save too big even without its message texts', () => {
  test('is refused with a terminal error, never committed for Firestore to reject', async () => {
    const store = createMemoryArtifactStore();
    const hugeTitle = 'T'.repeat(1_500_000);
    const transcript = {
      messages: [
        { role: 'user', content: 'q', promptId: 'p1' },
        { role: 'assistant', content: null, toolCalls: [{ id: 'c1', name: 'fetch_page', arguments: '{}' }] },
        { role: 'tool', toolCallId: 'c1', name: 'fetch_page', content: 'x'.repeat(OFFLOAD_CONTENT_BYTES + 1), sources: [{ n: 1, url: 'https://example.org/', title: hugeTitle, passage: '', fetchedAt: '' }] },
      ],
      generation: 0,
    };
    const encoded = encodeSave(EMPTY_LOG, transcript).document;
    await expect(offloadLargeContents(encoded, store, JOB)).rejects.toThrow(/over the .*budget of one document/);
    expect(SAVE_DOCUMENT_BUDGET_BYTES).toBeLessThan(1024 * 1024);
  });
});
