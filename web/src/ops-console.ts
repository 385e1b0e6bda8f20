/**
 * The operator console's view, for a user the security rules let read every job (the `admin`
 * claim): counts by pipeline and status, the lists of quarantined, failed, waiting and long-running
 * jobs, and one job opened (`#job=<id>`) with its timeline, units, effect ledger, cost and the
 * actions that apply to it. What it reads and what that costs: see ops-model.ts. Every piece of
 * text goes into the page as a text node (dom.ts `el`), never as HTML.
 */
import {
  collection,
  doc,
  getCountFromServer,
  getDocs,
  limit,
  limitToLast,
  onSnapshot,
  orderBy,
  query,
  Timestamp,
  where,
  type Firestore,
  type FirestoreError,
  type QueryConstraint,
  type Unsubscribe,
} from 'firebase/firestore';
import { el, timeOfDay } from './dom';
import { formatCost, PhaselineApiError, readEffect, readEvent, readUnit, type EffectView, type EventView, type UnitView } from '../../client';
import type { OpsActionRequest, OpsApi } from './ops-api';
import {
  actionsFor,
  countKey,
  countQueries,
  countTable,
  COUNTED_STATUSES,
  COUNTS_AFTER_CHANGE_MS,
  DEFAULT_LONG_RUNNING_MINUTES,
  ENDED_STATUSES,
  ENDED_WINDOW_HOURS,
  formatAge,
  LIST_LIMIT,
  LIST_NAMES,
  LIST_QUERIES,
  listEntry,
  longRunning,
  phasesOf,
  readOpsJob,
  REFRESH_MS,
  type CountCell,
  type ListName,
  type OpsJob,
} from './ops-model';

const TIMELINE_LIMIT = 200;
const JOB_LINK = /(?:^#|&)job=([A-Za-z0-9_-]{1,128})(?:&|$)/;

const LIST_TITLES: Readonly<Record<ListName, string>> = {
  quarantined: 'Quarantined',
  failed: 'Failed',
  waiting: 'Waiting',
  'long-running': 'Long-running',
};

function problem(error: unknown): string {
  if (error instanceof PhaselineApiError) return `${error.message} (${error.status})`;
  return error instanceof Error ? error.message : String(error);
}

function shortId(value: string, length = 10): string {
  return value.length > length ? `${value.slice(0, length)}…` : value;
}

interface ListView {
  readonly section: HTMLElement;
  readonly title: HTMLElement;
  readonly items: HTMLUListElement;
  readonly empty: HTMLParagraphElement;
  jobs: OpsJob[];
  /** Whether the listener delivered its first snapshot (the counts were read at start anyway). */
  loaded: boolean;
}

export class OpsConsole {
  readonly element: HTMLElement;
  private readonly banner = el('p', { className: 'error', testId: 'ops-error', attrs: { role: 'alert' } });
  private readonly countsBody = el('tbody');
  private readonly countsAt = el('span', { className: 'muted', testId: 'counts-at' });
  private readonly refreshButton = el('button', { className: 'secondary', text: 'Refresh', testId: 'ops-refresh', attrs: { type: 'button' } });
  private readonly minutesInput = el('input', { testId: 'long-running-minutes', attrs: { type: 'number', min: '1', max: '10080', value: String(DEFAULT_LONG_RUNNING_MINUTES), 'aria-label': 'Long-running: minutes' } });
  private readonly lists = new Map<ListName, ListView>();
  private counts = new Map<string, CountCell>();
  private runningJobs: OpsJob[] = [];
  private readonly subscriptions: Unsubscribe[] = [];
  private readonly timers: ReturnType<typeof setInterval>[] = [];
  private countsTimer: ReturnType<typeof setTimeout> | null = null;
  private refreshing = false;
  private readonly detail: JobDetail;

  constructor(
    private readonly db: Firestore,
    api: OpsApi,
    private readonly now: () => number = () => Date.now(),
  ) {
    this.banner.hidden = true;
    this.detail = new JobDetail(db, api, now, (message) => this.showError(message));
    const head = el('tr', {}, el('th', { text: 'Pipeline' }), ...COUNTED_STATUSES.map((status) => el('th', { text: ENDED_STATUSES.has(status) ? `${status} (${ENDED_WINDOW_HOURS} h)` : status })));
    const counts = el(
      'section',
      { className: 'ops-panel ops-counts', testId: 'ops-counts' },
      el('div', { className: 'ops-head' }, el('h2', { text: 'Jobs by pipeline and status' }), this.countsAt, this.refreshButton),
      el('table', { className: 'ops-table' }, el('thead', {}, head), this.countsBody),
    );
    const listsElement = el('div', { className: 'ops-lists' });
    for (const name of LIST_NAMES) {
      const title = el('h2');
      const items = el('ul', { className: 'ops-rows' });
      const empty = el('p', { className: 'muted', text: 'None.' });
      const head = el('div', { className: 'ops-head' }, title);
      if (name === 'long-running') head.append(el('label', { className: 'muted', text: 'over ' }, this.minutesInput, ' min'));
      const section = el('section', { className: `ops-panel ops-list list-${name}`, testId: `list-${name}` }, head, empty, items);
      listsElement.append(section);
      this.lists.set(name, { section, title, items, empty, jobs: [], loaded: false });
    }
    this.element = el('div', { className: 'ops', testId: 'ops-console' }, this.banner, counts, listsElement, this.detail.element);
    this.refreshButton.addEventListener('click', () => void this.refresh());
    this.minutesInput.addEventListener('change', () => this.renderList('long-running'));
    this.renderCounts();
    for (const name of LIST_NAMES) this.renderList(name);
  }

  /** Starts the live lists, the periodic refresh, and opens the job the address names. */
  start(): void {
    for (const name of LIST_NAMES) {
      const shape = LIST_QUERIES[name];
      if (!shape.live) continue;
      const listQuery = query(collection(this.db, 'jobs'), where('status', '==', shape.status), orderBy(shape.orderBy, shape.direction), limit(LIST_LIMIT));
      this.subscriptions.push(
        onSnapshot(
          listQuery,
          (snapshot) => {
            const list = this.lists.get(name);
            if (!list) return;
            list.jobs = snapshot.docs.map((job) => readOpsJob(job.id, job.data()));
            this.renderList(name);
            // Something moved: the counts follow shortly.
            if (list.loaded) this.scheduleCounts();
            list.loaded = true;
          },
          (error: FirestoreError) => this.showError(`Cannot read the ${name} jobs: ${error.message}`),
        ),
      );
    }
    void this.refresh();
    this.timers.push(setInterval(() => void this.refresh(), REFRESH_MS));
    const openLinked = (): void => {
      const jobId = JOB_LINK.exec(location.hash)?.[1];
      if (jobId) this.detail.open(jobId);
      else this.detail.close();
    };
    window.addEventListener('hashchange', openLinked);
    openLinked();
  }

  dispose(): void {
    for (const unsubscribe of this.subscriptions.splice(0)) unsubscribe();
    for (const timer of this.timers.splice(0)) clearInterval(timer);
    if (this.countsTimer !== null) clearTimeout(this.countsTimer);
    this.detail.close();
  }

  private showError(message: string): void {
    this.banner.textContent = message;
    this.banner.hidden = false;
  }

  private scheduleCounts(): void {
    if (this.countsTimer !== null) return;
    this.countsTimer = setTimeout(() => {
      this.countsTimer = null;
      void this.refreshCounts();
    }, COUNTS_AFTER_CHANGE_MS);
  }

  /** The counts and the long-running list, read once; the ages on every list are recomputed. */
  private async refresh(): Promise<void> {
    if (this.refreshing) return;
    this.refreshing = true;
    try {
      await Promise.all([this.refreshCounts(), this.refreshRunning()]);
      for (const name of LIST_NAMES) this.renderList(name);
    } finally {
      this.refreshing = false;
    }
  }

  private async refreshRunning(): Promise<void> {
    const shape = LIST_QUERIES['long-running'];
    try {
      const snapshot = await getDocs(query(collection(this.db, 'jobs'), where('status', '==', shape.status), orderBy(shape.orderBy, shape.direction), limit(LIST_LIMIT)));
      this.runningJobs = snapshot.docs.map((job) => readOpsJob(job.id, job.data()));
    } catch (error) {
      this.showError(`Cannot read the running jobs: ${problem(error)}`);
    }
  }

  private async refreshCounts(): Promise<void> {
    const nowMs = this.now();
    const shapes = countQueries(nowMs);
    const results = await Promise.all(
      shapes.map(async (shape): Promise<[string, CountCell]> => {
        const constraints: QueryConstraint[] = [where('pipeline', '==', shape.pipeline), where('status', '==', shape.status)];
        if (shape.finishedSinceMs !== null) constraints.push(where('finishedAt', '>=', Timestamp.fromMillis(shape.finishedSinceMs)));
        try {
          const counted = await getCountFromServer(query(collection(this.db, 'jobs'), ...constraints));
          return [countKey(shape.pipeline, shape.status), { kind: 'count', value: counted.data().count }];
        } catch (error) {
          return [countKey(shape.pipeline, shape.status), { kind: 'error', message: problem(error) }];
        }
      }),
    );
    this.counts = new Map(results);
    this.countsAt.textContent = `counted at ${timeOfDay(nowMs)}`;
    this.renderCounts();
  }

  private renderCounts(): void {
    this.countsBody.replaceChildren(
      ...countTable(this.counts).rows.map((row) =>
        el(
          'tr',
          { className: row.pipeline === 'all' ? 'ops-total' : '' },
          el('th', { text: row.pipeline }),
          ...row.cells.map((cell, index) => {
            const status = COUNTED_STATUSES[index] ?? '?';
            const td = el('td', { testId: 'count', attrs: { 'data-pipeline': row.pipeline, 'data-status': status } });
            if (cell === null) td.textContent = '…';
            else if (cell.kind === 'error') {
              td.textContent = '!';
              td.title = cell.message;
            } else {
              td.textContent = String(cell.value);
              if (cell.value > 0) td.className = `nonzero status-${status}`;
            }
            return td;
          }),
        ),
      ),
    );
  }

  private renderList(name: ListName): void {
    const list = this.lists.get(name);
    if (!list) return;
    const nowMs = this.now();
    const minutes = Math.max(1, Number(this.minutesInput.value) || DEFAULT_LONG_RUNNING_MINUTES);
    const jobs = name === 'long-running' ? longRunning(this.runningJobs, minutes, nowMs) : list.jobs;
    const capped = jobs.length >= LIST_LIMIT ? ` (the first ${LIST_LIMIT})` : '';
    list.title.textContent = `${LIST_TITLES[name]} · ${jobs.length}${capped}`;
    list.empty.hidden = jobs.length > 0;
    list.items.replaceChildren(
      ...jobs.map((job) => {
        const entry = listEntry(name, job);
        const open = el('a', { className: 'ops-job-link', text: shortId(job.view.id, 20), attrs: { href: `#job=${job.view.id}`, title: job.view.id } });
        return el(
          'li',
          { className: 'ops-row', testId: 'job-row', attrs: { 'data-job-id': job.view.id } },
          open,
          el('span', { className: 'ops-pipeline', text: job.view.pipeline }),
          el('span', { className: 'ops-owner muted', text: `owner ${shortId(job.owner)}`, attrs: { title: job.owner } }),
          el('span', { className: 'ops-age', testId: 'row-age', text: entry.sinceMs === null ? '?' : formatAge(nowMs - entry.sinceMs) }),
          el('span', { className: 'ops-reason', testId: 'row-reason', text: entry.reason }),
        );
      }),
    );
  }
}

/** One job, live: its document, timeline, units and effect ledger, and the actions that apply. */
class JobDetail {
  readonly element: HTMLElement;
  private readonly heading = el('h2', { testId: 'ops-job-id' });
  private readonly statusBadge = el('span', { className: 'badge', testId: 'ops-job-status' });
  private readonly facts = el('dl', { className: 'ops-facts', testId: 'ops-job-facts' });
  private readonly reason = el('p', { className: 'ops-reason-line', testId: 'ops-job-reason' });
  private readonly cost = el('p', { className: 'cost', testId: 'ops-job-cost' });
  private readonly releaseButton = el('button', { text: 'Release', testId: 'ops-release', attrs: { type: 'button' } });
  private readonly cancelReason = el('input', { testId: 'ops-cancel-reason', attrs: { type: 'text', maxlength: '500', placeholder: 'Reason for cancelling', 'aria-label': 'Reason for cancelling' } });
  private readonly cancelButton = el('button', { className: 'secondary', text: 'Cancel job', testId: 'ops-cancel', attrs: { type: 'button' } });
  private readonly redrivePhase = el('select', { testId: 'ops-redrive-phase', attrs: { 'aria-label': 'Re-drive from phase' } });
  private readonly redriveReason = el('input', { testId: 'ops-redrive-reason', attrs: { type: 'text', maxlength: '500', placeholder: 'Reason for re-driving', 'aria-label': 'Reason for re-driving' } });
  private readonly redriveButton = el('button', { className: 'secondary', text: 'Re-drive', testId: 'ops-redrive', attrs: { type: 'button' } });
  private readonly releaseGroup = el('div', { className: 'ops-action' }, this.releaseButton);
  private readonly cancelGroup = el('div', { className: 'ops-action' }, this.cancelReason, this.cancelButton);
  private readonly redriveGroup = el('div', { className: 'ops-action' }, el('span', { text: 'from' }), this.redrivePhase, this.redriveReason, this.redriveButton);
  private readonly noActions = el('p', { className: 'muted', text: 'No action applies to a job in this state.' });
  private readonly actionMessage = el('p', { className: 'action-message', testId: 'ops-action-message', attrs: { role: 'status' } });
  private readonly unitsBody = el('tbody');
  private readonly unitsSection = el(
    'section',
    { testId: 'ops-units' },
    el('h3', { text: 'Units' }),
    el('table', { className: 'ops-table' }, el('thead', {}, el('tr', {}, el('th', { text: 'Unit' }), el('th', { text: 'Status' }), el('th', { text: 'Epoch' }), el('th', { text: 'Progress' }))), this.unitsBody),
  );
  private readonly effectsBody = el('tbody');
  private readonly effectsSection = el(
    'section',
    { testId: 'ops-effects' },
    el('h3', { text: 'Effects' }),
    el('table', { className: 'ops-table' }, el('thead', {}, el('tr', {}, el('th', { text: 'Key' }), el('th', { text: 'State' }), el('th', { text: 'What' }))), this.effectsBody),
  );
  private readonly timelineTitle = el('h3');
  private readonly timeline = el('ol', { className: 'events', testId: 'ops-timeline' });
  private readonly readError = el('p', { className: 'error', testId: 'ops-job-error' });

  private jobId: string | null = null;
  private job: OpsJob | null = null;
  private events: EventView[] = [];
  private units: UnitView[] = [];
  private effects: EffectView[] = [];
  private subscriptions: Unsubscribe[] = [];
  private busy = false;

  constructor(
    private readonly db: Firestore,
    private readonly api: OpsApi,
    private readonly now: () => number,
    private readonly reportError: (message: string) => void,
  ) {
    const close = el('a', { className: 'ops-close', text: 'Close', attrs: { href: '#' } });
    this.element = el(
      'section',
      { className: 'ops-panel ops-job', testId: 'ops-job' },
      el('div', { className: 'ops-head' }, this.heading, this.statusBadge, close),
      this.readError,
      this.facts,
      this.reason,
      this.cost,
      el('div', { className: 'ops-actions', testId: 'ops-actions' }, this.releaseGroup, this.cancelGroup, this.redriveGroup, this.noActions, this.actionMessage),
      this.unitsSection,
      this.effectsSection,
      el('section', { className: 'ops-timeline' }, this.timelineTitle, this.timeline),
    );
    this.element.hidden = true;
    this.readError.hidden = true;
    this.releaseButton.addEventListener('click', () => {
      if (this.jobId) void this.act({ action: 'release', jobId: this.jobId });
    });
    this.cancelButton.addEventListener('click', () => {
      if (this.jobId) void this.act({ action: 'cancel', jobId: this.jobId, reason: this.cancelReason.value.trim() || 'cancelled from the operator console' });
    });
    this.redriveButton.addEventListener('click', () => {
      if (!this.jobId) return;
      const reason = this.redriveReason.value.trim();
      if (reason === '') {
        this.actionMessage.textContent = 'Give a reason for the re-drive: it goes on the job\'s timeline.';
        this.redriveReason.focus();
        return;
      }
      void this.act({ action: 'redrive', jobId: this.jobId, fromPhase: this.redrivePhase.value, reason });
    });
  }

  open(jobId: string): void {
    if (this.jobId === jobId) return;
    this.close();
    this.jobId = jobId;
    this.element.hidden = false;
    this.element.dataset.jobId = jobId;
    this.heading.textContent = `Job ${jobId}`;
    this.actionMessage.textContent = '';
    this.cancelReason.value = '';
    this.redriveReason.value = '';
    const failed = (what: string) => (error: FirestoreError) => {
      this.readError.textContent = `Cannot read ${what}: ${error.message}`;
      this.readError.hidden = false;
      this.reportError(`Cannot read ${what} of job ${jobId}: ${error.message}`);
    };
    const jobs = collection(this.db, 'jobs');
    this.subscriptions = [
      onSnapshot(
        doc(jobs, jobId),
        (snapshot) => {
          if (!snapshot.exists()) {
            this.readError.textContent = `There is no job ${jobId}.`;
            this.readError.hidden = false;
            this.job = null;
          } else {
            this.job = readOpsJob(jobId, snapshot.data());
          }
          this.render();
        },
        failed('the job'),
      ),
      onSnapshot(
        query(collection(this.db, 'jobs', jobId, 'events'), orderBy('atMs'), limitToLast(TIMELINE_LIMIT)),
        (snapshot) => {
          this.events = snapshot.docs.map((event) => readEvent(event.id, event.data()));
          this.render();
        },
        failed('the timeline'),
      ),
      onSnapshot(
        collection(this.db, 'jobs', jobId, 'units'),
        (snapshot) => {
          this.units = snapshot.docs.map((unit) => readUnit(unit.id, unit.data()));
          this.render();
        },
        failed('the units'),
      ),
      onSnapshot(
        collection(this.db, 'jobs', jobId, 'effects'),
        (snapshot) => {
          this.effects = snapshot.docs.map((effect) => readEffect(effect.id, effect.data()));
          this.render();
        },
        failed('the effects'),
      ),
    ];
    this.render();
    this.element.scrollIntoView({ block: 'start' });
  }

  close(): void {
    for (const unsubscribe of this.subscriptions.splice(0)) unsubscribe();
    this.jobId = null;
    this.job = null;
    this.events = [];
    this.units = [];
    this.effects = [];
    this.element.hidden = true;
    this.readError.hidden = true;
    delete this.element.dataset.jobId;
  }

  private async act(request: OpsActionRequest): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    this.render();
    this.actionMessage.textContent = `${request.action}…`;
    try {
      const answer = await this.api(request);
      if (this.jobId === request.jobId) this.actionMessage.textContent = `${request.action}: done; the job is ${answer.status}.`;
    } catch (error) {
      if (this.jobId === request.jobId) this.actionMessage.textContent = `${request.action} refused: ${problem(error)}`;
    } finally {
      this.busy = false;
      this.render();
    }
  }

  private render(): void {
    const job = this.job;
    const status = job?.rawStatus ?? 'unknown';
    this.statusBadge.textContent = job ? status : '…';
    this.statusBadge.className = `badge status-${job?.view.status ?? 'unknown'}`;
    this.element.dataset.status = status;
    this.renderFacts(job);
    this.reason.textContent = job ? reasonOf(job) : '';
    this.reason.hidden = this.reason.textContent === '';
    this.cost.textContent = job ? `Cost: ${formatCost(job.view.cost)}` : '';

    const actions = actionsFor(job ? status : 'unknown');
    this.releaseGroup.hidden = !actions.has('release');
    this.cancelGroup.hidden = !actions.has('cancel');
    this.redriveGroup.hidden = !actions.has('redrive');
    this.noActions.hidden = actions.size > 0 || job === null;
    for (const button of [this.releaseButton, this.cancelButton, this.redriveButton]) button.disabled = this.busy;
    const phases = job ? phasesOf(job.view.pipeline) : [];
    const current = this.redrivePhase.value;
    if (this.redrivePhase.options.length !== phases.length || [...this.redrivePhase.options].some((option, index) => option.value !== phases[index])) {
      this.redrivePhase.replaceChildren(...phases.map((phase) => el('option', { text: phase, attrs: { value: phase } })));
      if (phases.includes(current)) this.redrivePhase.value = current;
    }
    this.redriveButton.disabled = this.busy || phases.length === 0;

    this.unitsSection.hidden = this.units.length === 0;
    this.unitsBody.replaceChildren(
      ...this.units.map((unit) =>
        el(
          'tr',
          { testId: 'ops-unit' },
          el('td', { text: unit.unit }),
          el('td', { text: unit.status }),
          el('td', { text: String(unit.epoch) }),
          el('td', { text: Object.entries(unit.progress).map(([name, value]) => `${name} ${value}`).join(', ') }),
        ),
      ),
    );
    this.effectsSection.hidden = this.effects.length === 0;
    this.effectsBody.replaceChildren(
      ...this.effects.map((effect) =>
        el('tr', { testId: 'ops-effect' }, el('td', { className: 'ops-key', text: effect.id }), el('td', { text: effect.state }), el('td', { text: effect.intent ?? '' })),
      ),
    );
    this.timelineTitle.textContent = `Timeline · ${this.events.length} event${this.events.length === 1 ? '' : 's'}`;
    this.timeline.replaceChildren(
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

  private renderFacts(job: OpsJob | null): void {
    if (!job) {
      this.facts.replaceChildren();
      return;
    }
    const nowMs = this.now();
    const ago = (ms: number | null): string => (ms === null ? '—' : `${formatAge(nowMs - ms)} ago (${new Date(ms).toISOString()})`);
    const rows: [string, string][] = [
      ['Pipeline', job.view.pipeline],
      ['Owner', job.owner],
      ['Phase', job.view.phase ?? '—'],
      ['Step · epoch', `${job.step} · ${job.view.epoch}`],
      ['Attempts · lost workers', `${job.view.attempts} · ${job.view.staleReclaims}`],
      ['Submitted', ago(job.createdAtMs)],
      ['Last written', ago(job.updatedAtMs)],
      ['Ended', ago(job.finishedAtMs)],
    ];
    if (job.view.question) rows.splice(1, 0, ['Question', job.view.question]);
    if (job.view.fanout) rows.push(['Fan-out', `${job.view.fanout.phase}: ${job.view.fanout.done} of ${job.view.fanout.units} units done`]);
    this.facts.replaceChildren(...rows.flatMap(([term, value]) => [el('dt', { text: term }), el('dd', { text: value })]));
  }
}

/** Why the job stands where it does, when the document says. */
function reasonOf(job: OpsJob): string {
  const view = job.view;
  if (view.status === 'quarantined') return `Quarantine reason: ${view.quarantine?.reason ?? 'none recorded'}`;
  if (view.status === 'failed') return `Last error: ${view.lastError ? `${view.lastError.code}: ${view.lastError.message}` : 'none recorded'}`;
  if (view.status === 'waiting') return `Waiting (${job.waitingReason ?? '?'}): ${view.waiting?.question ?? ''}`;
  if (view.status === 'cancelled') return view.cancellation?.report ?? 'Cancelled.';
  if (view.lastError) return `Last error: ${view.lastError.code}: ${view.lastError.message}`;
  return '';
}
