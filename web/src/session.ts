/**
 * What this browser tab remembers (sessionStorage): its conversation and the questions it sent,
 * with each one's Idempotency-Key, so a reload reconnects to running jobs and re-sends, with the
 * same key, a question whose submission was never acknowledged.
 */
import { newIdempotencyKey } from '../../client';
import type { ResearchRequest } from './research-view';

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
    // A random UUID, the same kind as a message's key, names the conversation.
    const session = new Session(storage, newIdempotencyKey(), []);
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
