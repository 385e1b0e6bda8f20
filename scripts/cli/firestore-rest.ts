/**
 * The user's reads, through the Firestore REST API with their Firebase ID token: the security
 * rules apply exactly as they do to the chat page. The same calls work against the emulator and a
 * deployed project; only the base URL differs.
 */
import { CliError, connectionProblem } from './errors';

/** A Firestore REST `Value`; exactly one member is set. */
export interface RestValue {
  readonly nullValue?: null;
  readonly booleanValue?: boolean;
  readonly integerValue?: string;
  readonly doubleValue?: number | string;
  readonly timestampValue?: string;
  readonly stringValue?: string;
  readonly bytesValue?: string;
  readonly referenceValue?: string;
  readonly geoPointValue?: { readonly latitude?: number; readonly longitude?: number };
  readonly arrayValue?: { readonly values?: readonly RestValue[] };
  readonly mapValue?: { readonly fields?: Readonly<Record<string, RestValue>> };
}

interface RestDocument {
  readonly name: string;
  readonly fields?: Readonly<Record<string, RestValue>>;
}

/** Plain JavaScript from a REST value: timestamps become Dates, integers numbers. */
export function decodeValue(value: RestValue): unknown {
  if ('nullValue' in value) return null;
  if (value.booleanValue !== undefined) return value.booleanValue;
  if (value.integerValue !== undefined) return Number(value.integerValue);
  if (value.doubleValue !== undefined) return Number(value.doubleValue);
  if (value.timestampValue !== undefined) return new Date(value.timestampValue);
  if (value.stringValue !== undefined) return value.stringValue;
  if (value.bytesValue !== undefined) return Buffer.from(value.bytesValue, 'base64');
  if (value.referenceValue !== undefined) return value.referenceValue;
  if (value.geoPointValue !== undefined) return { latitude: value.geoPointValue.latitude ?? 0, longitude: value.geoPointValue.longitude ?? 0 };
  if (value.arrayValue !== undefined) return (value.arrayValue.values ?? []).map(decodeValue);
  if (value.mapValue !== undefined) return decodeFields(value.mapValue.fields ?? {});
  return null;
}

export function decodeFields(fields: Readonly<Record<string, RestValue>>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(fields).map(([name, value]) => [name, decodeValue(value)]));
}

export interface FetchedDocument {
  readonly id: string;
  /** Path below `documents/`, like `jobs/abc/events/j00000001`. */
  readonly path: string;
  readonly data: Record<string, unknown>;
}

export type FilterValue = string | number;
export interface Filter {
  readonly field: string;
  readonly op: 'EQUAL' | 'GREATER_THAN_OR_EQUAL';
  readonly value: FilterValue;
}
export interface Query {
  /** Collection ID under `parent` (the database root when parent is ''). */
  readonly collection: string;
  readonly where?: readonly Filter[];
  readonly orderBy?: readonly { readonly field: string; readonly direction: 'ASCENDING' | 'DESCENDING' }[];
  readonly limit?: number;
}

export interface UserFirestore {
  /** The document, or null when it does not exist or the rules do not let this user read it. */
  get(path: string): Promise<FetchedDocument | null>;
  query(parent: string, query: Query): Promise<FetchedDocument[]>;
}

function encodeFilterValue(value: FilterValue): RestValue {
  if (typeof value === 'string') return { stringValue: value };
  return Number.isInteger(value) ? { integerValue: String(value) } : { doubleValue: value };
}

function structuredQuery(query: Query): Record<string, unknown> {
  const filters = (query.where ?? []).map((filter) => ({
    fieldFilter: { field: { fieldPath: filter.field }, op: filter.op, value: encodeFilterValue(filter.value) },
  }));
  return {
    from: [{ collectionId: query.collection }],
    ...(filters.length === 1 ? { where: filters[0] } : filters.length > 1 ? { where: { compositeFilter: { op: 'AND', filters } } } : {}),
    ...(query.orderBy ? { orderBy: query.orderBy.map((order) => ({ field: { fieldPath: order.field }, direction: order.direction })) } : {}),
    ...(query.limit === undefined ? {} : { limit: query.limit }),
  };
}

export interface UserFirestoreOptions {
  /** Base of the REST API, up to and including `/v1`. */
  readonly baseUrl: string;
  readonly projectId: string;
  /** The user's current ID token. */
  readonly idToken: () => Promise<string>;
  /** Names the service in errors ("the Firestore emulator at 127.0.0.1:8080"). */
  readonly describe: string;
  /** What to do about a service that does not answer. */
  readonly unreachableHint: string;
  readonly fetch?: typeof fetch;
}

export function userFirestore(options: UserFirestoreOptions): UserFirestore {
  const doFetch = options.fetch ?? fetch;
  const root = `projects/${options.projectId}/databases/(default)/documents`;

  async function call(url: string, init: RequestInit): Promise<Response> {
    const token = await options.idToken();
    try {
      return await doFetch(url, {
        ...init,
        headers: { ...(init.headers as Record<string, string> | undefined), authorization: `Bearer ${token}` },
        signal: AbortSignal.timeout(30_000),
      });
    } catch (error) {
      throw new CliError(`Could not reach ${options.describe} (${connectionProblem(error)}). ${options.unreachableHint}`);
    }
  }

  async function failure(response: Response, what: string): Promise<CliError> {
    const text = await response.text();
    let message = text.slice(0, 500);
    try {
      const body = JSON.parse(text) as unknown;
      const parsed = (Array.isArray(body) ? (body[0] as unknown) : body) as { error?: { message?: unknown; status?: unknown } } | null;
      if (typeof parsed?.error?.message === 'string') message = parsed.error.message;
    } catch {
      // Not JSON: the text itself.
    }
    return new CliError(`Reading ${what} failed (${response.status}): ${message}`);
  }

  const toDocument = (document: RestDocument): FetchedDocument => {
    const path = document.name.slice(document.name.indexOf('/documents/') + '/documents/'.length);
    return { id: path.slice(path.lastIndexOf('/') + 1), path, data: decodeFields(document.fields ?? {}) };
  };

  return {
    async get(path) {
      const response = await call(`${options.baseUrl}/${root}/${path}`, { method: 'GET' });
      // The rules deny a read of a missing document and of someone else's alike.
      if (response.status === 404 || response.status === 403) return null;
      if (!response.ok) throw await failure(response, path);
      return toDocument((await response.json()) as RestDocument);
    },
    async query(parent, query) {
      const url = `${options.baseUrl}/${root}${parent === '' ? '' : `/${parent}`}:runQuery`;
      const response = await call(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ structuredQuery: structuredQuery(query) }),
      });
      if (!response.ok) throw await failure(response, `${parent === '' ? '' : `${parent}/`}${query.collection}`);
      const results = (await response.json()) as readonly { readonly document?: RestDocument }[];
      return results.flatMap((result) => (result.document ? [toDocument(result.document)] : []));
    },
  };
}
