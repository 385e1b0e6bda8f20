/**
 * The chat page: anonymous sign-in on the Auth emulator, a message box that submits a research
 * question to `submitJob`, and one live turn per job (see turn.ts). A link with `#job=<task ID>`
 * opens a job of the signed-in user that this tab did not send.
 */
import './styles.css';
import { createPhaselineClient, newIdempotencyKey } from '../../client';
import { connectAndSignIn } from './connect';
import { byId } from './dom';
import type { ResearchRequest } from './research-view';
import { Session, type TurnRecord } from './session';
import { Turn, type TurnDeps } from './turn';

const JOB_LINK = /(?:^#|&)job=([A-Za-z0-9_-]{1,128})(?:&|$)/;

function numberIn(input: HTMLInputElement, min: number, max: number, name: string): number {
  const value = Number(input.value);
  if (!Number.isInteger(value) || value < min || value > max) throw new Error(`${name} must be a whole number from ${min} to ${max}`);
  return value;
}

async function main(): Promise<void> {
  const who = byId('who', HTMLSpanElement);
  const thread = byId('thread', HTMLElement);
  const empty = byId('empty', HTMLParagraphElement);
  const form = byId('composer', HTMLFormElement);
  const question = byId('question', HTMLTextAreaElement);
  const send = byId('send', HTMLButtonElement);
  const status = byId('composer-status', HTMLParagraphElement);
  const experts = byId('experts', HTMLInputElement);
  const sections = byId('sections', HTMLInputElement);
  const words = byId('words', HTMLInputElement);

  const { config, db, user } = await connectAndSignIn();
  who.textContent = `Signed in anonymously · ${user.uid.slice(0, 8)}…`;
  who.title = user.uid;
  who.dataset.uid = user.uid;

  const session = Session.load(sessionStorage);
  const deps: TurnDeps = { client: createPhaselineClient({ db, functionsBaseUrl: config.functionsBaseUrl, idToken: () => user.getIdToken() }), session };
  const turns: Turn[] = [];
  const show = (record: TurnRecord): Turn => {
    const turn = new Turn(deps, record);
    turns.push(turn);
    empty.hidden = true;
    thread.append(turn.element);
    turn.start();
    return turn;
  };
  for (const record of session.turns) show(record);

  const openLinkedJob = (): void => {
    const jobId = JOB_LINK.exec(location.hash)?.[1];
    if (!jobId) return;
    const open = turns.find((turn) => turn.jobId === jobId);
    if (open) {
      open.element.scrollIntoView({ block: 'start' });
      return;
    }
    show(session.add({ key: null, request: null, jobId })).element.scrollIntoView({ block: 'start' });
  };
  openLinkedJob();
  window.addEventListener('hashchange', openLinkedJob);

  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const text = question.value.trim();
    let request: ResearchRequest;
    try {
      if (text.length < 10) throw new Error('Ask a question of at least 10 characters.');
      request = {
        question: text,
        experts: numberIn(experts, 1, 5, 'Experts'),
        sections: numberIn(sections, 1, 6, 'Sections'),
        wordsPerSection: numberIn(words, 50, 800, 'Words per section'),
      };
    } catch (error) {
      status.textContent = error instanceof Error ? error.message : String(error);
      return;
    }
    status.textContent = '';
    question.value = '';
    // One key per message, stored with it: every retry of this send reuses it.
    const turn = show(session.add({ key: newIdempotencyKey(), request, jobId: null }));
    turn.element.scrollIntoView({ block: 'end', behavior: 'smooth' });
  });
  question.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  send.disabled = false;
  document.body.dataset.ready = 'true';
}

main().catch((error: unknown) => {
  const who = document.getElementById('who');
  const message = error instanceof Error ? error.message : String(error);
  if (who) who.textContent = `Not connected: ${message}`;
  document.body.dataset.ready = 'error';
  console.error(error);
});
