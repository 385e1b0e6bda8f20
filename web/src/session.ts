/**
 * What this browser tab remembers (sessionStorage): its conversation and the questions it sent,
 * with each one's Idempotency-Key, so a reload reconnects to running jobs and re-sends, with the
 * same key, a question whose submission was never acknowledged.
 */
import type { ResearchRequest } from './api';

export interface TurnRecord {
  /** The Idempotency-Key of the submission; null for a job opened by link (#job=ID). */
  readonly key: string | null;
  readonly request: ResearchRequest | null;
  jobId: string | null;
}

interface Stored {
  readonly conversationId: string;
  readonly turns: TurnRecord[];
}

const STORAGE_KEY = 'phaseline.session.v1';

export function newId(): string {
  if (typeof crypto.randomUUID === 'function') return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[6] = ((bytes[6] ?? 0) & 0x0f) | 0x40;
  bytes[8] = ((bytes[8] ?? 0) & 0x3f) | 0x80;
  const hex = [...bytes].map((byte) => byte.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function isTurn(value: unknown): value is TurnRecord {
  if (typeof value !== 'object' || value === null) return false;
  const turn = value as Readonly<Record<string, unknown>>;
  return (turn.key === null || typeof turn.key === 'string') && (turn.jobId === null || typeof turn.jobId === 'string') && 'request' in turn;
}

export class Session {
  private constructor(
    private readonly storage: Storage,
    readonly conversationId: string,
    readonly turns: TurnRecord[],
  ) {}

  static load(storage: Storage): Session {
    try {
      const parsed: unknown = JSON.parse(storage.getItem(STORAGE_KEY) ?? 'null');
      if (typeof parsed === 'object' && parsed !== null) {
        const stored = parsed as Partial<Stored>;
        if (typeof stored.conversationId === 'string' && Array.isArray(stored.turns)) {
          return new Session(storage, stored.conversationId, stored.turns.filter(isTurn));
        }
      }
    } catch {
      // A damaged entry starts a new session.
    }
    const session = new Session(storage, newId(), []);
    session.save();
    return session;
  }

  add(turn: TurnRecord): TurnRecord {
    this.turns.push(turn);
    this.save();
    return turn;
  }

  setJobId(turn: TurnRecord, jobId: string): void {
    turn.jobId = jobId;
    this.save();
  }

  private save(): void {
    const stored: Stored = { conversationId: this.conversationId, turns: this.turns };
    this.storage.setItem(STORAGE_KEY, JSON.stringify(stored));
  }
}
