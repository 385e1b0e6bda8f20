/**
 * `phaseline admin grant|revoke <uid>`: who is an operator. An operator is a Firebase Auth user with
 * the custom claim `admin: true`, which the security rules (firestore.rules) and `opsAction` check;
 * the operator console (/ops) is for them. `phaseline admin allow|disallow <uid> <pipeline>`: which
 * pipelines whose access is `granted` (notify) a user may run, listed in their custom claim
 * `phaselinePipelines` (functions/src/core/pipeline.ts), which submitJob and decideJob check.
 * Through the admin SDK's Auth API: the Auth emulator locally (FIREBASE_AUTH_EMULATOR_HOST, else
 * firebase.json's port), Application Default Credentials for a deployed project. The user's other
 * custom claims are kept.
 */
import { randomBytes } from 'node:crypto';
import { deleteApp, initializeApp } from 'firebase-admin/app';
import { getAuth, type UserRecord } from 'firebase-admin/auth';
import { grantedPipelinesOf, PIPELINE_GRANTS_CLAIM } from '../../functions/src/core/pipeline';
import { CliError, connectionProblem, EXIT } from './errors';
import type { Io } from './io';
import { describeTarget, ENV, type Target } from './target';

/** The claim the rules and opsAction check (functions/src/http/ops-handler.ts OPERATOR_CLAIM). */
export const OPERATOR_CLAIM = 'admin';

export type AdminAction = 'grant' | 'revoke';
export const ADMIN_ACTIONS: readonly AdminAction[] = ['grant', 'revoke'];
/** Granting and withdrawing one pipeline. */
export type PipelineGrantAction = 'allow' | 'disallow';
export const PIPELINE_GRANT_ACTIONS: readonly PipelineGrantAction[] = ['allow', 'disallow'];

export type AdminCommand =
  | { readonly action: AdminAction; readonly uid: string }
  | { readonly action: PipelineGrantAction; readonly uid: string; readonly pipeline: string };

/** The claims with `pipeline` added to (allow) or taken from (disallow) the grants claim; null when no claim is left. */
export function claimsWithPipeline(claims: Readonly<Record<string, unknown>>, pipeline: string, allow: boolean): Record<string, unknown> | null {
  const { [PIPELINE_GRANTS_CLAIM]: _was, ...others } = claims;
  const granted = new Set(grantedPipelinesOf(claims));
  if (allow) granted.add(pipeline);
  else granted.delete(pipeline);
  const next: Record<string, unknown> = granted.size > 0 ? { ...others, [PIPELINE_GRANTS_CLAIM]: [...granted].sort() } : others;
  return Object.keys(next).length > 0 ? next : null;
}

export async function adminCommand(target: Target, io: Io, command: AdminCommand): Promise<number> {
  if (target.kind === 'local') {
    try {
      await fetch(`http://${target.hosts.auth}/`, { signal: AbortSignal.timeout(3_000) });
    } catch (error) {
      throw new CliError(`Could not reach the Auth emulator at ${target.hosts.auth} (${connectionProblem(error)}). Is the local stack running? Start it with \`npm start\`.`);
    }
    process.env[ENV.authEmulator] = target.hosts.auth;
  }
  const app = initializeApp({ projectId: target.projectId }, `phaseline-cli-admin-${randomBytes(4).toString('hex')}`);
  try {
    const auth = getAuth(app);
    let user: UserRecord;
    try {
      user = await auth.getUser(command.uid);
    } catch (error) {
      if ((error as { code?: unknown }).code === 'auth/user-not-found') throw new CliError(`There is no user ${command.uid} on ${describeTarget(target)}`);
      throw error;
    }
    if (command.action === 'allow' || command.action === 'disallow') {
      const allow = command.action === 'allow';
      await auth.setCustomUserClaims(command.uid, claimsWithPipeline(user.customClaims ?? {}, command.pipeline, allow));
      if (allow) {
        io.out(`User ${command.uid} may run ${command.pipeline} now (custom claim ${PIPELINE_GRANTS_CLAIM}).`);
        io.err('It takes effect with their next ID token (a new sign-in, or a token refresh).');
        return EXIT.ok;
      }
      // Without this, the ID token they hold keeps the grant until it expires (up to an hour).
      await auth.revokeRefreshTokens(command.uid);
      io.out(`User ${command.uid} may no longer run ${command.pipeline}; their sessions were signed out.`);
      io.err('submitJob and decideJob refuse the ID token they still hold within seconds (they check revocation).');
      return EXIT.ok;
    }
    const { [OPERATOR_CLAIM]: _was, ...others } = user.customClaims ?? {};
    if (command.action === 'grant') {
      await auth.setCustomUserClaims(command.uid, { ...others, [OPERATOR_CLAIM]: true });
      io.out(`User ${command.uid} is an operator now (custom claim ${OPERATOR_CLAIM}: true).`);
      io.err('It takes effect with their next ID token: on the operator console, "Check again" (or a reload) fetches one.');
      return EXIT.ok;
    }
    await auth.setCustomUserClaims(command.uid, Object.keys(others).length > 0 ? others : null);
    // Without this, the ID token they hold keeps the claim until it expires (up to an hour).
    await auth.revokeRefreshTokens(command.uid);
    io.out(`User ${command.uid} is no longer an operator; their sessions were signed out.`);
    io.err('opsAction refuses the ID token they still hold at once (it checks revocation); Firestore reads with it stop when it expires, within the hour.');
    return EXIT.ok;
  } finally {
    await deleteApp(app);
  }
}
