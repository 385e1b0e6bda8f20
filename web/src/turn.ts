/**
 * One exchange in the chat: the question the person asked and the assistant's side, which is the
 * job's live state read from Firestore (the job document, its units, its timeline, effects whose
 * outcome is unknown) until the finished report arrives from the outbox and becomes the reply.
 */
import {
  ACTIVE_STATUSES,
  describeStatus,
  formatCost,
  PhaselineApiError,
  type EffectView,
  type EventView,
  type JobSnapshot,
  type JobView,
  type JobWaitView,
  type PhaselineClient,
  type ResultView,
  type SourceView,
  type UnitView,
  type WatchedPart,
} from '../../client';
import { el, timeOfDay } from './dom';
import { renderMarkdown } from './markdown';
import { liveReport, summarizeProgress } from './research-view';
import type { Session, TurnRecord } from './session';

export interface TurnDeps {
  readonly client: PhaselineClient;
  readonly session: Session;
}

const CANCEL_REASON = 'cancelled from the chat page';

/** A live section's cited sources: `[k] title`, linked only to http(s) addresses. */
function sourceList(sources: readonly SourceView[]): HTMLElement {
  return el(
    'ol',
    { className: 'live-sources', testId: 'live-sources' },
    ...sources.map((source) => {
      const label = `[${source.number}] ${source.title || source.url}`;
      const linkable = /^https?:\/\//i.test(source.url);
      return el('li', {}, linkable ? el('a', { text: label, attrs: { href: source.url, rel: 'noopener noreferrer', target: '_blank' } }) : el('span', { text: label }));
    }),
  );
}

function problem(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** What the read-error line names for each part of the job the page watches. */
const PART_NAMES: Readonly<Record<WatchedPart, string>> = {
  job: 'the job',
  events: 'the timeline',
  units: 'the fan-out units',
  sections: 'the sections',
  drafts: 'the drafts',
  effects: 'the effect ledger',
  result: 'the report',
};

export class Turn {
  readonly element: HTMLElement;
  private readonly questionText = el('p', { className: 'bubble-text', testId: 'user-question' });
  private readonly sendState = el('div', { className: 'send-state', testId: 'send-state' });
  private readonly card = el('div', { className: 'job-card', testId: 'job-card' });
  private readonly statusBadge = el('span', { className: 'badge', testId: 'job-status' });
  private readonly statusText = el('span', { className: 'status-text', testId: 'status-text' });
  private readonly jobLabel = el('span', { className: 'job-id' });
  private readonly barFill = el('div', { className: 'fill' });
  private readonly bar = el('div', { className: 'bar', attrs: { role: 'progressbar', 'aria-valuemin': '0', 'aria-valuemax': '100' } }, this.barFill);
  private readonly progressText = el('p', { className: 'counts', testId: 'progress' });
  private readonly unitsList = el('ul', { className: 'units', testId: 'units' });
  private readonly costLine = el('p', { className: 'cost', testId: 'cost' });
  private readonly retriesLine = el('p', { className: 'retries', testId: 'retries' });
  private readonly waitingPanel = el('div', { className: 'panel waiting', testId: 'waiting' });
  private readonly checkingPanel = el('div', { className: 'panel checking', testId: 'checking' });
  private readonly skippedPanel = el('div', { className: 'panel skipped', testId: 'skipped' });
  private readonly outcomeNote = el('p', { className: 'outcome-note', testId: 'outcome-note' });
  private readonly readError = el('p', { className: 'error', testId: 'read-error' });
  private readonly reply = el('div', { className: 'reply markdown', testId: 'reply' });
  /** The report as it is written, until the published one replaces it. */
  private readonly live = el('div', { className: 'live-report', testId: 'live-report' });
  private readonly liveFinished = new Map<string, HTMLElement>();
  private readonly timelineSummary = el('summary');
  private readonly timelineList = el('ol', { className: 'events' });
  private readonly timeline = el('details', { className: 'timeline', testId: 'timeline' }, this.timelineSummary, this.timelineList);
  private readonly cancelButton = el('button', { className: 'secondary', text: 'Cancel job', testId: 'cancel', attrs: { type: 'button' } });
  private readonly actionMessage = el('p', { className: 'action-message', testId: 'action-message', attrs: { role: 'status' } });

  private snapshot: JobSnapshot | null = null;
  private renderedWait = '';
  private stopWatching: (() => void) | null = null;

  constructor(
    private readonly deps: TurnDeps,
    private readonly record: TurnRecord,
  ) {
    this.questionText.textContent = record.request?.question ?? 'Opened from a link';
    const header = el('div', { className: 'status-row' }, this.statusBadge, this.statusText, this.jobLabel);
    this.card.append(
      header,
      this.bar,
      this.progressText,
      this.unitsList,
      this.costLine,
      this.retriesLine,
      this.waitingPanel,
      this.checkingPanel,
      this.skippedPanel,
      this.outcomeNote,
      this.readError,
      this.live,
      this.reply,
      el('div', { className: 'actions' }, this.cancelButton, this.actionMessage),
      this.timeline,
    );
    this.card.hidden = true;
    for (const hidden of [this.readError, this.waitingPanel, this.checkingPanel, this.skippedPanel, this.outcomeNote, this.reply, this.live, this.retriesLine]) hidden.hidden = true;
    this.cancelButton.addEventListener('click', () => void this.cancel());
    this.element = el(
      'article',
      { className: 'turn', testId: 'turn' },
      el('div', { className: 'bubble user' }, this.questionText),
      el('div', { className: 'bubble assistant' }, this.sendState, this.card),
    );
    this.render();
  }

  /** Watches the job, or sends the question first if it was never acknowledged. */
  start(): void {
    if (this.record.jobId) this.watch(this.record.jobId);
    else void this.send();
  }

  get jobId(): string | null {
    return this.record.jobId;
  }

  dispose(): void {
    this.stopWatching?.();
    this.stopWatching = null;
  }

  private get job(): JobView | null {
    return this.snapshot?.job ?? null;
  }

  private get units(): readonly UnitView[] {
    return this.snapshot?.units ?? [];
  }

  private get events(): readonly EventView[] {
    return this.snapshot?.events ?? [];
  }

  private get unknownEffects(): readonly EffectView[] {
    return this.snapshot?.unknownEffects ?? [];
  }

  private get result(): ResultView | null {
    return this.snapshot?.result ?? null;
  }

  private async send(): Promise<void> {
    const { request, key } = this.record;
    if (!request || !key) return;
    this.sendState.replaceChildren(el('p', { className: 'muted', text: 'Sending…' }));
    try {
      const answer = await this.deps.client.submit({ pipeline: 'research', input: request, idempotencyKey: key, conversationId: this.deps.session.conversationId });
      this.deps.session.setJobId(this.record, answer.jobId);
      this.sendState.replaceChildren();
      this.watch(answer.jobId);
    } catch (error) {
      if (error instanceof PhaselineApiError && error.limitReached) {
        this.showLimitReached(error);
        return;
      }
      const retry = !(error instanceof PhaselineApiError) || error.retryable;
      const message = el('p', { className: 'error', text: `${retry ? 'Not sent' : 'Not accepted'}: ${problem(error)}` });
      // The same Idempotency-Key again: if an earlier try did reach the server, this finds that job.
      const again = el('button', { text: 'Try again', testId: 'retry-send', attrs: { type: 'button' } });
      again.addEventListener('click', () => void this.send());
      this.sendState.replaceChildren(message, ...(retry ? [again] : []));
    }
  }

  /**
   * One of the user's limits refused the question: its sentence, when it may be asked again, and
   * a button that waits until then (a try before it is refused again, never counted).
   */
  private showLimitReached(error: PhaselineApiError): void {
    const retryAtMs = Date.now() + (error.retryAfterSeconds ?? 0) * 1000;
    const when = el('p', { className: 'muted', testId: 'limit-retry-at', text: error.retryAfterSeconds === null ? '' : `You can try again at ${timeOfDay(retryAtMs)}.` });
    const again = el('button', { text: 'Try again', testId: 'retry-send', attrs: { type: 'button' } });
    again.addEventListener('click', () => void this.send());
    const waitMs = retryAtMs - Date.now();
    if (waitMs > 0) {
      again.disabled = true;
      // Re-enabled when the limit should have freed; a timer far off (a day's spend) is capped by the browser's own limit.
      setTimeout(() => {
        again.disabled = false;
      }, Math.min(waitMs, 2 ** 31 - 1));
    }
    this.sendState.replaceChildren(
      el(
        'div',
        { className: 'limit-reached', testId: 'limit-reached' },
        el('p', { className: 'panel-title', text: 'Limit reached' }),
        el('p', { testId: 'limit-message', text: error.message }),
        when,
        again,
      ),
    );
  }

  private watch(jobId: string): void {
    this.element.dataset.jobId = jobId;
    this.jobLabel.textContent = `task ${jobId}`;
    this.card.hidden = false;
    this.stopWatching = this.deps.client.watch(
      jobId,
      (snapshot) => {
        this.snapshot = snapshot;
        this.render();
      },
      {
        onError: (error) =>
          this.showReadError(`Cannot read ${PART_NAMES[error.part]}: ${error.part === 'job' && error.code === 'permission-denied' ? 'it does not exist or is not yours' : error.message}`),
      },
    );
  }

  private showReadError(message: string): void {
    this.readError.textContent = message;
    this.readError.hidden = false;
  }

  private async cancel(): Promise<void> {
    const job = this.job;
    if (!job) return;
    this.cancelButton.disabled = true;
    this.actionMessage.textContent = 'Cancelling…';
    try {
      await this.deps.client.cancel(job.id, CANCEL_REASON);
      this.actionMessage.textContent = 'Cancel request accepted.';
    } catch (error) {
      this.actionMessage.textContent = `Cancel failed: ${problem(error)}`;
      this.cancelButton.disabled = false;
    }
  }

  private async decide(questionId: string, answer: string, buttons: readonly HTMLButtonElement[]): Promise<void> {
    const job = this.job;
    if (!job) return;
    for (const button of buttons) button.disabled = true;
    this.actionMessage.textContent = `Sending your answer: ${answer}…`;
    try {
      await this.deps.client.answer(job.id, questionId, answer);
      const stopping = job.waiting?.reason === 'budget' && answer === 'cancel';
      this.actionMessage.textContent = stopping ? 'Cancel request accepted.' : `Answered: ${answer}. The job continues.`;
    } catch (error) {
      this.actionMessage.textContent = `The answer was not taken: ${problem(error)}`;
      for (const button of buttons) button.disabled = false;
    }
  }

  private render(): void {
    const job = this.job;
    if (job?.question && !this.record.request) this.questionText.textContent = job.question;
    if (!job) {
      this.statusBadge.textContent = 'connecting';
      return;
    }
    this.element.dataset.status = job.status;
    this.statusBadge.textContent = job.status;
    this.statusBadge.className = `badge status-${job.status}`;
    this.statusText.textContent = describeStatus(job);

    const progress = summarizeProgress(job, this.units);
    const percent = Math.round(progress.fraction * 100);
    this.barFill.style.width = `${percent}%`;
    this.bar.setAttribute('aria-valuenow', String(percent));
    const active = ACTIVE_STATUSES.has(job.status);
    this.bar.hidden = !active;
    const counts = [
      job.phase ? `phase ${job.phase}` : null,
      progress.expertSections.total > 0
        ? `expert sections ${progress.expertSections.done}/${progress.expertSections.total}${progress.expertSections.skipped > 0 ? ` (${progress.expertSections.skipped} skipped)` : ''}`
        : null,
      progress.units ? `experts ${progress.units.done}/${progress.units.total} (fan-out units)` : null,
      progress.reportSections.total > 0 ? `report sections ${progress.reportSections.done}/${progress.reportSections.total}` : null,
    ].filter((part): part is string => part !== null);
    this.progressText.textContent = counts.length > 0 ? counts.join(' · ') : active ? 'Waiting for the first step to start…' : '';
    this.progressText.hidden = job.status === 'completed' || this.progressText.textContent === '';

    this.unitsList.replaceChildren(
      ...(active ? this.units : []).map((unit) => {
        const done = unit.progress.sectionsDone ?? 0;
        const total = unit.progress.sectionsTotal ?? job.progress.sectionsTotal ?? 0;
        return el('li', { className: `unit unit-${unit.status}`, text: `${unit.unit}: ${unit.status}${total > 0 ? `, ${done}/${total} sections` : ''}` });
      }),
    );

    this.costLine.textContent = formatCost(job.cost);
    this.retriesLine.textContent =
      job.attempts > 0 || job.staleReclaims > 0
        ? `Recovered so far: ${job.attempts} retried error${job.attempts === 1 ? '' : 's'}, ${job.staleReclaims} reclaim${job.staleReclaims === 1 ? '' : 's'} after a worker went silent${
            job.lastError && active ? ` (last: ${job.lastError.message})` : ''
          }`
        : '';
    this.retriesLine.hidden = this.retriesLine.textContent === '';

    this.renderWaiting(job);
    this.renderChecking();
    this.renderSkipped();
    this.renderOutcome(job);
    this.renderLive(job);

    this.cancelButton.hidden = !active;

    const last = this.events.at(-1);
    const lastMessage = last && last.message.length > 90 ? `${last.message.slice(0, 89)}…` : last?.message;
    this.timelineSummary.textContent = `Timeline · ${this.events.length} event${this.events.length === 1 ? '' : 's'}${lastMessage ? ` · last: ${lastMessage}` : ''}`;
    this.timelineList.replaceChildren(
      ...this.events.map((event) =>
        el(
          'li',
          { className: `event event-${event.kind}` },
          el('time', { text: timeOfDay(event.atMs) }),
          el('span', { className: 'kind', text: event.kind }),
          el('span', { className: 'message', text: `${event.unit ? `[${event.unit}] ` : ''}${event.message}` }),
        ),
      ),
    );
  }

  /** Finished report sections as they are recorded, and the text of sections in flight; gone once the report is published. */
  private renderLive(job: JobView): void {
    const published = job.status === 'completed' && this.result !== null;
    const report = published || !this.snapshot ? { finished: [], writing: [] } : liveReport(job, this.snapshot.sections, this.snapshot.drafts, this.snapshot.units);
    this.live.hidden = report.finished.length === 0 && report.writing.length === 0;
    if (this.live.hidden) {
      this.live.replaceChildren();
      this.liveFinished.clear();
      return;
    }
    // A finished section never changes: render it once, keep its element.
    const finished = report.finished.map((section) => {
      let element = this.liveFinished.get(section.key);
      if (!element) {
        element = el('section', { className: 'live-section markdown', testId: 'live-section' });
        element.innerHTML = renderMarkdown(`## ${section.heading}\n\n${section.text}`); // every piece of text escaped by the renderer
        // The section's own [k] markers and what they cite; the published report numbers them across sections.
        if (section.sources.length > 0) element.append(sourceList(section.sources));
        this.liveFinished.set(section.key, element);
      }
      return element;
    });
    const writing = report.writing.map((draft) =>
      el(
        'section',
        { className: 'live-draft', testId: 'live-draft' },
        el('p', { className: 'draft-label', text: `Writing ${draft.label}…` }),
        el('p', { className: 'draft-text', text: draft.text }),
      ),
    );
    this.live.replaceChildren(...finished, ...writing);
  }

  private renderWaiting(job: JobView): void {
    const waiting = job.status === 'waiting' ? job.waiting : null;
    // The step is in the key: a job that waits again with the same question (resumed while still over its cap) gets fresh buttons.
    const key = waiting ? `${job.step}|${waiting.reason}|${waiting.questionId}|${waiting.question}|${waiting.options.join('\u0000')}|${waiting.untilMs ?? ''}` : '';
    if (key === this.renderedWait) return;
    this.renderedWait = key;
    this.waitingPanel.hidden = waiting === null;
    if (!waiting) {
      this.waitingPanel.replaceChildren();
      return;
    }
    if (waiting.reason === 'provider') {
      const until = waiting.untilMs ? ` It tries again at ${timeOfDay(waiting.untilMs)}.` : '';
      this.waitingPanel.replaceChildren(el('p', { text: `${waiting.question || 'The model provider is unavailable.'}${until}` }));
      return;
    }
    if (waiting.reason === 'budget') {
      this.renderBudgetWait(waiting);
      return;
    }
    const buttons = waiting.options.map((option) => el('button', { text: option, testId: 'decision-option', attrs: { type: 'button' } }));
    buttons.forEach((button, index) => button.addEventListener('click', () => void this.decide(waiting.questionId, waiting.options[index] ?? '', buttons)));
    this.waitingPanel.replaceChildren(
      el('p', { className: 'panel-title', text: 'The job needs your decision' }),
      el('p', { className: 'question', testId: 'decision-question', text: waiting.question }),
      el('div', { className: 'options' }, ...buttons),
    );
  }

  /** The owner's daily spend limit paused the job: what happened, when it resumes by itself, and the two answers. */
  private renderBudgetWait(waiting: JobWaitView): void {
    const labels: Readonly<Record<string, string>> = { resume: 'Resume now', cancel: 'Cancel the job' };
    const buttons = waiting.options.map((option) => el('button', { text: labels[option] ?? option, testId: `budget-${option}`, attrs: { type: 'button' } }));
    buttons.forEach((button, index) => button.addEventListener('click', () => void this.decide(waiting.questionId, waiting.options[index] ?? '', buttons)));
    this.waitingPanel.replaceChildren(
      el('p', { className: 'panel-title', text: 'Paused at your daily spend limit' }),
      el('p', { className: 'question', testId: 'budget-question', text: waiting.question }),
      el('p', {
        className: 'muted',
        testId: 'budget-until',
        text: waiting.untilMs === null ? '' : `It resumes by itself at ${new Date(waiting.untilMs).toLocaleString()}. Resume now if your limit was raised; it pauses again if not.`,
      }),
      el('div', { className: 'options' }, ...buttons),
    );
  }

  private renderChecking(): void {
    const effects = this.unknownEffects;
    this.checkingPanel.hidden = effects.length === 0;
    if (effects.length === 0) return;
    this.checkingPanel.replaceChildren(
      el('p', { className: 'panel-title', text: 'Checking what happened' }),
      el('p', {
        text: `${effects.length} action${effects.length === 1 ? ' was' : 's were'} in flight and ${effects.length === 1 ? 'its' : 'their'} outcome is not known yet. It is being checked against the system of record before anything is retried.`,
      }),
      el('ul', {}, ...effects.map((effect) => el('li', { text: effect.intent ? `${effect.intent} (${effect.id})` : effect.id }))),
    );
  }

  private renderSkipped(): void {
    const skipped = this.events.filter((event) => event.kind === 'section-skipped').map((event) => event.message);
    const missing = this.result?.missing ?? [];
    const items = [...new Set([...skipped, ...missing])];
    this.skippedPanel.hidden = items.length === 0;
    if (items.length === 0) return;
    this.skippedPanel.replaceChildren(
      el('p', { className: 'panel-title', text: 'Skipped sections' }),
      el('ul', {}, ...items.map((item) => el('li', { text: item }))),
    );
  }

  private renderOutcome(job: JobView): void {
    let note = '';
    if (job.status === 'failed') note = `The job failed: ${job.lastError?.message ?? 'no reason recorded'}`;
    else if (job.status === 'cancelled') note = job.cancellation?.report ?? 'Cancelled.';
    else if (job.status === 'quarantined') note = `Quarantined: ${job.quarantine?.reason ?? 'it kept stopping its workers'}. An operator can release it.`;
    else if (job.status === 'completed' && !this.result) note = 'Finished; loading the report…';
    else if (job.status === 'completed' && this.result?.outcome === 'partial') note = 'Finished, but some parts are missing: they are named at the end of the report.';
    this.outcomeNote.textContent = note;
    this.outcomeNote.hidden = note === '';
    const result = job.status === 'completed' ? this.result : null;
    this.reply.hidden = result === null;
    if (result && this.reply.dataset.rendered !== job.id) {
      this.reply.innerHTML = renderMarkdown(result.markdown); // every piece of text escaped by the renderer
      this.reply.dataset.rendered = job.id;
      this.element.dataset.replied = 'true';
    }
  }
}
