/**
 * Drafts on the official Firestore emulator: a research job whose provider streams shows each
 * section's text in flight in `jobs/{id}/drafts/{sectionKey}` (with the claim's epoch), never in
 * the job document, and the durable transcript still holds complete model answers only.
 */
import { JOBS } from '../../functions/src/store/paths';
import { decodeJob } from '../../functions/src/store/codec';
import { engineSuite } from '../support/engine';
import { researchSetup, type ResearchSetup } from '../support/research';

let research: ResearchSetup;

const harness = engineSuite('drafts', (firestore, clock) => {
  research = researchSetup(firestore.db, clock, { epochMs: Date.UTC(2026, 0, 1) });
  return research.registry;
}, {
  beforeEach: () => {
    research.provider.intercept = null;
  },
});

const db = () => harness.firestore.db;
const question = { question: 'How do leases and fencing tokens keep stale workers from corrupting results?', experts: 2, sections: 2, wordsPerSection: 60 };

test('a streaming provider: each section in flight shows a draft apart from the job document; transcripts keep complete answers only', async () => {
  // The offline simulator streams when asked: it shows its answer in three growing pieces. Every complete answer is noted here.
  const answers = new Set<string>();
  let streamedCalls = 0;
  research.provider.intercept = async (request, call) => {
    if (request.onText) streamedCalls += 1;
    const response = await call();
    if (response.message.content) answers.add(response.message.content);
    return response;
  };
  const jobId = await harness.submit('research', question);
  await harness.drain();
  const job = decodeJob(jobId, (await db().doc(`${JOBS}/${jobId}`).get()).data());
  expect(job.status).toBe('completed');
  expect(streamedCalls).toBeGreaterThan(5);

  const sections = await db().collection(`${JOBS}/${jobId}/sections`).get();
  const sectionIds = new Set(sections.docs.map((doc) => `${doc.get('phase') as string}/${(doc.get('unit') as string | null) ?? ''}/${doc.get('id') as string}`));
  const checkpointed = new Set((await db().collection(`${JOBS}/${jobId}/checkpoints`).get()).docs.map((doc) => doc.id));
  const drafts = await db().collection(`${JOBS}/${jobId}/drafts`).get();
  // One draft per section that wrote text: expert sections (in units) and report sections.
  expect(drafts.size).toBeGreaterThanOrEqual(question.experts * question.sections);
  let partial = 0;
  for (const draft of drafts.docs) {
    const { phase, unit, id, text, epoch, updatedAtMs } = draft.data() as { phase: string; unit: string | null; id: string; text: string; epoch: number; updatedAtMs: number };
    expect(epoch).toBeGreaterThanOrEqual(1);
    expect(updatedAtMs).toBeGreaterThan(0);
    // The draft is the beginning of an answer the model gave, and belongs to a section of the job.
    expect([...answers].some((answer) => answer.startsWith(text))).toBe(true);
    if (!answers.has(text)) partial += 1;
    // Phases that end in a checkpoint (the outline) run an agent section without recording it as a section.
    expect(sectionIds.has(`${phase}/${unit ?? ''}/${id}`) || checkpointed.has(phase)).toBe(true);
  }
  // The clock stands still here, so each section's first piece is written and the rest wait their turn: drafts show text in flight.
  expect(partial).toBe(drafts.size);
  // The job document carries no draft text.
  expect(JSON.stringify((await db().doc(`${JOBS}/${jobId}`).get()).data())).not.toContain(drafts.docs[0]?.get('text') as string);

  // What is durable: every assistant message saved in a transcript is a complete answer.
  const saves = await db().collection(`${JOBS}/${jobId}/transcripts`).get();
  const savedAssistantTexts = saves.docs.flatMap((doc) => {
    const messages = (doc.get('messages') ?? doc.get('transcript.messages') ?? []) as { role: string; content: string | null }[];
    return messages.filter((message) => message.role === 'assistant' && message.content).map((message) => message.content as string);
  });
  expect(savedAssistantTexts.length).toBeGreaterThan(0);
  for (const text of savedAssistantTexts) expect(answers.has(text)).toBe(true);
});
