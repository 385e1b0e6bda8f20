/**
 * The operator console's calls to `opsAction` (functions/src/http/ops-handler.ts), with the
 * operator's ID token. An action is not retried: the operator sees the answer (or the failure) and
 * decides; the job's live view shows whether it took effect.
 */
import { PhaselineApiError } from '../../client';
import type { PageConfig } from './config';

export type OpsActionRequest =
  | { readonly action: 'release'; readonly jobId: string }
  | { readonly action: 'cancel'; readonly jobId: string; readonly reason: string }
  | { readonly action: 'redrive'; readonly jobId: string; readonly fromPhase: string; readonly reason: string };

export interface OpsActionAnswer {
  readonly status: string;
  readonly fields: Readonly<Record<string, unknown>>;
}

export type OpsApi = (request: OpsActionRequest) => Promise<OpsActionAnswer>;

export function createOpsApi(config: PageConfig, idToken: () => Promise<string>): OpsApi {
  return async (request) => {
    let response: Response;
    try {
      response = await fetch(`${config.functionsBaseUrl}/opsAction`, {
        method: 'POST',
        headers: { authorization: `Bearer ${await idToken()}`, 'content-type': 'application/json' },
        body: JSON.stringify(request),
      });
    } catch (error) {
      throw new PhaselineApiError(0, 'network', `Could not reach opsAction: ${error instanceof Error ? error.message : String(error)}`);
    }
    const payload: unknown = await response.json().catch(() => null);
    const fields = typeof payload === 'object' && payload !== null ? (payload as Readonly<Record<string, unknown>>) : {};
    if (!response.ok) {
      const message = typeof fields.message === 'string' ? fields.message : `opsAction answered ${response.status}`;
      throw new PhaselineApiError(response.status, typeof fields.error === 'string' ? fields.error : 'http_error', message);
    }
    return { status: typeof fields.status === 'string' ? fields.status : '?', fields };
  };
}
