/**
 * Artifacts on the Firestore emulator: 5 MB and 20 MB round trips in chunks, refusal of a
 * tampered chunk, a tampered size and a missing chunk, one write for content put twice, and no
 * reader ever seeing part of an artifact. Then the two users: fetch_page on a 5 MB page keeps the
 * full text durably while the model sees its token budget, and a section whose tool result is
 * 2 MB saves, resumes and comes back byte for byte, or loads as unreadable when its artifact is gone.
 */
import { createHash } from 'node:crypto';
import type { ToolCall } from '../../functions/src/agent/provider';
import { ManualClock } from '../../functions/src/core/clock';
import { pipelineRegistry, type PhaseOutcome, type StepContext } from '../../functions/src/core/pipeline';
import { configuredProvider } from '../../functions/src/pipelines/providers';
import { ArtifactBudgetError, ArtifactUnreadableError, CHUNK_BYTES, firestoreArtifactStore, sha256Hex, type ArtifactRef, type ArtifactStore } from '../../functions/src/store/artifact-store';
import { ARTIFACT_CHUNKS, ARTIFACTS, artifactChunkPath, artifactPath, JOBS } from '../../functions/src/store/paths';
import { engineHarness, type EngineHarness } from '../support/engine';
import { behaviour, resetBehaviour, testPipeline, type TestInput } from '../support/test-pipeline';
import { startServer, type LocalServer } from '../support/web-servers';

const MB = 1024 * 1024;
const JOB = 'job-artifacts';
const TEXT = { contentType: 'text/plain; charset=utf-8' };

let harness: EngineHarness;
let store: ArtifactStore;
beforeAll(() => {
  harness = engineHarness('artifact-store', pipelineRegistry(testPipeline));
  store = firestoreArtifactStore(harness.firestore.db, new ManualClock());
});
beforeEach(async () => {
  resetBehaviour();
  harness.queue.drain();
  await harness.firestore.reset();
});
afterAll(() => harness.firestore.close());

const db = () => harness.firestore.db;

/** Bytes no two positions of which are likely to repeat in step with a chunk, so a misplaced chunk changes the hash. */
function contentOf(size: number, seed: string): Buffer {
  const bytes = Buffer.alloc(size);
  let block = createHash('sha256').update(seed).digest();
  for (let offset = 0; offset < size; offset += block.length) {
    block.copy(bytes, offset);
    block = createHash('sha256').update(block).digest();
  }
  return bytes;
}

async function faultOf(read: Promise<unknown>): Promise<string> {
  try {
    await read;
  } catch (error) {
    if (error instanceof ArtifactUnreadableError) return error.fault;
    throw error;
  }
  throw new Error('the read was not refused');
}

describe('round trips', () => {
  test.each([
    ['5 MB', 5 * MB],
    ['20 MB', 20 * MB],
  ])('a %s artifact is stored in chunks under 1 MiB, manifest last, and read back whole with its hash', async (_label, size) => {
    const bytes = contentOf(size, `round trip ${size}`);
    const { ref, written } = await store.put(JOB, bytes, { contentType: 'application/octet-stream' });
    expect(written).toBe(true);
    expect(ref).toEqual({ sha256: sha256Hex(bytes), size, contentType: 'application/octet-stream' });
    const chunks = await db().collection(`${JOBS}/${JOB}/${ARTIFACT_CHUNKS}`).get();
    expect(chunks.size).toBe(Math.ceil(size / CHUNK_BYTES));
    for (const chunk of chunks.docs) expect((chunk.get('bytes') as Buffer).byteLength).toBeLessThanOrEqual(CHUNK_BYTES);
    const manifest = await db().doc(artifactPath(JOB, ref.sha256)).get();
    expect(manifest.data()).toMatchObject({ sha256: ref.sha256, size, chunkCount: chunks.size, contentType: 'application/octet-stream' });
    // Written after every chunk: no chunk is newer than the manifest.
    for (const chunk of chunks.docs) expect(chunk.updateTime.toMillis()).toBeLessThanOrEqual(manifest.updateTime!.toMillis());

    const read = await store.get(JOB, ref);
    expect(read.byteLength).toBe(size);
    expect(sha256Hex(read)).toBe(ref.sha256);
    expect(read.equals(bytes)).toBe(true);
  });

  test('text is stored as its UTF-8 bytes; an empty artifact has a manifest and no chunks', async () => {
    const text = 'Fencing tokens — één, 二, 🚀';
    const { ref } = await store.put(JOB, text, TEXT);
    expect(ref.size).toBe(Buffer.byteLength(text));
    expect((await store.get(JOB, ref)).toString('utf8')).toBe(text);
    const empty = await store.put(JOB, '', TEXT);
    expect((await store.get(JOB, empty.ref)).byteLength).toBe(0);
  });
});

describe('refusals', () => {
  let ref: ArtifactRef;
  beforeEach(async () => {
    ({ ref } = await store.put(JOB, contentOf(3 * CHUNK_BYTES + 10, 'tamper'), { contentType: 'application/octet-stream' }));
  });

  test('a tampered chunk is refused: hash mismatch', async () => {
    const chunk = db().doc(artifactChunkPath(JOB, ref.sha256, 1));
    const bytes = Buffer.from((await chunk.get()).get('bytes') as Buffer);
    bytes[100] = (bytes[100]! + 1) % 256;
    await chunk.update({ bytes });
    expect(await faultOf(store.get(JOB, ref))).toBe('hash_mismatch');
  });

  test('a tampered size is refused: in the manifest, and in the reference', async () => {
    expect(await faultOf(store.get(JOB, { ...ref, size: ref.size - 1 }))).toBe('size_mismatch');
    await db().doc(artifactPath(JOB, ref.sha256)).update({ size: ref.size + 1 });
    expect(await faultOf(store.get(JOB, ref))).toBe('size_mismatch');
  });

  test('a shortened chunk is refused: size mismatch', async () => {
    const chunk = db().doc(artifactChunkPath(JOB, ref.sha256, 3));
    await chunk.update({ bytes: Buffer.from((await chunk.get()).get('bytes') as Buffer).subarray(1) });
    expect(await faultOf(store.get(JOB, ref))).toBe('size_mismatch');
  });

  test('a missing chunk, a missing manifest, another job and a malformed hash are refused', async () => {
    expect(await faultOf(store.get('another-job', ref))).toBe('missing');
    expect(await faultOf(store.get(JOB, { sha256: '../../x', size: 1 }))).toBe('malformed');
    await db().doc(artifactChunkPath(JOB, ref.sha256, 2)).delete();
    expect(await faultOf(store.get(JOB, ref))).toBe('chunk_missing');
    await db().doc(artifactPath(JOB, ref.sha256)).delete();
    expect(await faultOf(store.get(JOB, ref))).toBe('missing');
  });
});

test('a put of content already stored writes nothing: the same manifest and chunks, untouched', async () => {
  const bytes = contentOf(2 * CHUNK_BYTES + 1, 'twice');
  const first = await store.put(JOB, bytes, { contentType: 'application/octet-stream' });
  const times = async () => (await db().collectionGroup(ARTIFACT_CHUNKS).get()).docs.map((doc) => doc.updateTime.toMillis());
  const manifestTime = async () => (await db().doc(artifactPath(JOB, first.ref.sha256)).get()).updateTime?.toMillis();
  const [chunksBefore, manifestBefore] = [await times(), await manifestTime()];
  const second = await store.put(JOB, Buffer.from(bytes), { contentType: 'application/octet-stream' });
  expect([first.written, second.written]).toEqual([true, false]);
  expect(second.ref).toEqual(first.ref);
  expect(await times()).toEqual(chunksBefore);
  expect(await manifestTime()).toBe(manifestBefore);
  expect((await db().collectionGroup(ARTIFACTS).get()).size).toBe(1);
});

test('a reader during a put sees no artifact or all of it, never part of one', async () => {
  const bytes = contentOf(12 * CHUNK_BYTES, 'concurrent');
  const ref = { sha256: sha256Hex(bytes), size: bytes.byteLength };
  const putting = { done: false };
  const put = store.put(JOB, bytes, { contentType: 'application/octet-stream' }).finally(() => {
    putting.done = true;
  });
  const seen: string[] = [];
  while (!putting.done) {
    try {
      const read = await store.get(JOB, ref);
      seen.push(read.equals(bytes) ? 'whole' : 'wrong');
    } catch (error) {
      seen.push(error instanceof ArtifactUnreadableError ? error.fault : String(error));
    }
    // And the documents themselves: a manifest only once every chunk is there.
    const [manifest, chunks] = await Promise.all([db().doc(artifactPath(JOB, ref.sha256)).get(), db().collection(`${JOBS}/${JOB}/${ARTIFACT_CHUNKS}`).get()]);
    if (manifest.exists) expect(chunks.size).toBe(12);
  }
  await put;
  seen.push((await store.get(JOB, ref)).equals(bytes) ? 'whole' : 'wrong');
  expect(seen.length).toBeGreaterThan(1);
  expect(seen.filter((outcome) => outcome !== 'missing' && outcome !== 'whole')).toEqual([]);
  expect(seen.at(-1)).toBe('whole');
});

describe("the job's byte budget", () => {
  test('bug 37: a put that would take the job past its budget is refused before anything is written; content already kept, and other jobs, are not held to it', async () => {
    const budget = { ...TEXT, maxJobBytes: 3 * MB };
    await store.put(JOB, contentOf(MB, 'a'), budget);
    await store.put(JOB, contentOf(MB, 'b'), budget);
    const refused = store.put(JOB, contentOf(2 * MB, 'c'), budget);
    await expect(refused).rejects.toThrow(ArtifactBudgetError);
    await expect(refused).rejects.toThrow(`would take job ${JOB}'s artifacts to ${4 * MB} bytes, past its budget of ${3 * MB}`);
    // Nothing of the refused content was written: only the chunks of the two kept ones are there.
    expect((await db().collection(`${JOBS}/${JOB}/${ARTIFACT_CHUNKS}`).get()).size).toBe(4);
    expect((await db().collection(`${JOBS}/${JOB}/${ARTIFACTS}`).get()).size).toBe(2);
    // Content already kept costs nothing; exactly the budget is allowed; another job has its own.
    expect((await store.put(JOB, contentOf(MB, 'a'), budget)).written).toBe(false);
    expect((await store.put(JOB, contentOf(MB, 'd'), budget)).written).toBe(true);
    expect((await store.put('job-other', contentOf(2 * MB, 'c'), budget)).written).toBe(true);
    // Without a budget (the transcript's offloads) a put is not refused.
    expect((await store.put(JOB, contentOf(MB, 'e'), TEXT)).written).toBe(true);
  });
});

describe('fetch_page keeps the full text of a 5 MB page', () => {
  let site: LocalServer;
  const PARAGRAPH = 'Fencing tokens stop a stale writer: the storage refuses a write whose token is older than one it has seen. ';
  const paragraphs = Math.ceil((5 * MB) / PARAGRAPH.length);
  const html = `<!doctype html><html><head><title>Five megabytes of leases</title></head><body><main>${Array.from({ length: paragraphs }, (_, index) => `<p>${index} ${PARAGRAPH}</p>`).join('\n')}</main></body></html>`;
  beforeAll(async () => {
    site = await startServer((_request, response) => {
      response.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
      response.end(html);
    });
  });
  afterAll(() => site.close());

  test('the model gets the token budget and is told the full text was kept; the artifact loads back whole with its hash', async () => {
    expect(Buffer.byteLength(html)).toBeGreaterThan(5 * MB);
    const { toolbox } = configuredProvider(
      new ManualClock(),
      {
        PHASELINE_SEARCH: 'searxng',
        PHASELINE_SEARXNG_URL: 'http://127.0.0.1:9/',
        PHASELINE_FETCH_ALLOWED_ADDRESSES: `127.0.0.1:${site.port}`,
        PHASELINE_FETCH_MAX_BYTES: String(6 * MB),
        PHASELINE_FETCH_TIMEOUT_MS: '120000',
        PHASELINE_FETCH_TOKEN_BUDGET: '4000',
      },
      { artifacts: store },
    );
    const bound = toolbox.forJob?.(JOB);
    if (bound === undefined) throw new Error('the web toolbox binds to a job');
    const call: ToolCall = { id: 'call_big_page', name: 'fetch_page', arguments: JSON.stringify({ url: `${site.url}/big` }) };
    const result = await bound.execute(call, new AbortController().signal);

    expect(result.ok).toBe(true);
    const content = JSON.parse(result.content) as { text: string; truncated: unknown; notes: string[]; artifact: { ref: string; sha256: string; size: number } };
    expect(content.truncated).toEqual({ bytes: false, tokens: true });
    expect(content.text.length).toBeLessThanOrEqual(4_000 * 4 + 2);
    expect(result.content.length).toBeLessThan(20_000);
    expect(content.notes).toEqual([expect.stringContaining(`the full text (${content.artifact.size} bytes) is kept as artifact ${content.artifact.ref}`)]);
    expect(content.artifact.size).toBeGreaterThan(5 * MB);
    expect(result.sources?.[0]?.artifact).toEqual(content.artifact);

    const full = await store.get(JOB, content.artifact);
    expect(sha256Hex(full)).toBe(content.artifact.sha256);
    const text = full.toString('utf8');
    expect(text.startsWith(content.text.replace(/ …$/, ''))).toBe(true);
    expect(text).toContain(`${paragraphs - 1} ${PARAGRAPH.trim()}`);
  });
});

describe('a section whose tool result is 2 MB', () => {
  const RESULT = contentOf(MB, 'tool result').toString('hex');
  const head = { generation: 0, attempts: { warm: 0, cold: 0 } };
  const call = { role: 'assistant', content: null, toolCalls: [{ id: 'c1', name: 'fetch_page', arguments: '{}' }] };
  const withResult = { ...head, messages: [call, { role: 'tool', toolCallId: 'c1', name: 'fetch_page', content: RESULT }] };
  const answered = { ...head, messages: [...withResult.messages, { role: 'assistant', content: 'done' }] };

  /** Step 1 saves the result and yields; step 2 loads it (the test may interfere in between) and goes on. */
  function twoSteps(loaded: unknown[]): void {
    behaviour.second = async (context: StepContext<TestInput>): Promise<PhaseOutcome<{ total: number }>> => {
      const transcript = await context.loadTranscript('big');
      loaded.push(transcript);
      if (transcript === null) {
        await context.saveTranscript('big', withResult);
        return { kind: 'yield' };
      }
      await context.saveTranscript('big', answered);
      await context.recordSection('big', { value: 1 });
      return { kind: 'done', state: { total: 1 } };
    };
  }

  test('saves, resumes in the next step and is byte-identical; the save documents hold a reference, not the bytes', async () => {
    expect(Buffer.byteLength(RESULT)).toBe(2 * MB);
    const loaded: unknown[] = [];
    twoSteps(loaded);
    const jobId = await harness.submit('two-phase', { sections: 1 });
    const outcomes = await harness.drain(5);

    expect(outcomes.map((outcome) => outcome.kind)).toEqual(['handed-off', 'handed-off', 'handed-off', 'completed']);
    expect(loaded[0]).toBeNull();
    expect(JSON.stringify(loaded[1])).toBe(JSON.stringify(withResult));
    const saves = (await db().collection(`${JOBS}/${jobId}/transcripts`).get()).docs.sort((a, b) => a.id.localeCompare(b.id));
    expect(saves.map((save) => save.get('keep') as unknown)).toEqual([0, 2]);
    expect(saves[0]?.get('offloaded')).toEqual([{ index: 1, sha256: sha256Hex(Buffer.from(RESULT)), size: 2 * MB }]);
    for (const save of saves) expect(JSON.stringify(save.data()).length).toBeLessThan(2_000);
    const artifacts = await db().collection(`${JOBS}/${jobId}/${ARTIFACTS}`).get();
    expect(artifacts.size).toBe(1);
  });

  test('with its artifact gone, the transcript loads as unreadable, never as a shorter thread', async () => {
    const loaded: unknown[] = [];
    twoSteps(loaded);
    const jobId = await harness.submit('two-phase', { sections: 1 });
    await harness.drain(2); // phase one, then the step that saves and yields
    const [manifest] = (await db().collection(`${JOBS}/${jobId}/${ARTIFACTS}`).get()).docs;
    await manifest!.ref.delete();
    await harness.drain(1);

    expect(loaded[1]).toEqual({ unreadableTranscript: 'save 0: the offloaded content of message 1 is unreadable (missing)' });
  });
});
