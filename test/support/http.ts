/** An HTTP response that records what a handler answered, for the handler tests of every layer. */
import type { HttpResponse } from '../../functions/src/http/request';

export class RecordingResponse implements HttpResponse {
  statusCode: number | undefined;
  readonly headers = new Map<string, string>();
  /** The headers as the handler named them (case kept). */
  readonly headersAsSet: Record<string, string> = {};
  body: unknown;
  /** How many times an answer was sent (json, send or end): a handler answers once. */
  sent = 0;
  status(code: number): this {
    this.statusCode = code;
    return this;
  }
  set(field: string, value: string): this {
    this.headers.set(field.toLowerCase(), value);
    this.headersAsSet[field] = value;
    return this;
  }
  setHeader(field: string, value: string): this {
    return this.set(field, value);
  }
  json(body: unknown): this {
    this.body = body;
    this.sent += 1;
    return this;
  }
  send(body: unknown): this {
    this.body = body;
    this.sent += 1;
    return this;
  }
  end(): this {
    this.sent += 1;
    return this;
  }
}
