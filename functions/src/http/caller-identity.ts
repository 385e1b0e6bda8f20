/**
 * Who is calling, from a Firebase ID token: the one verification every endpoint uses (submitJob,
 * cancelJob, decideJob, opsAction). A token is refused when it is malformed, expired, for another
 * project, or when its account was disabled or its sessions revoked since it was issued.
 *
 * The revocation check costs a lookup of the account (the admin SDK's `verifyIdToken(token, true)`
 * asks Auth for the user), so a positive answer is reused for REVOCATION_CHECK_REUSE_MS per uid:
 * a revocation or a disabled account takes effect within that much time, not when the token
 * expires (up to an hour). Without the check, the admin SDK accepts such a token in production
 * (under the Auth emulator it always checks, which is why the tests inject the Auth object).
 * Firebase-free: the trigger passes the admin SDK's Auth, tests a stand-in.
 */
import type { Clock } from '../core/clock';

/** A decoded Firebase ID token, as far as this module reads it; custom claims sit at the top level. */
export interface DecodedIdToken {
  readonly uid: string;
  /** When the user signed in, in seconds: a revocation refuses tokens from sign-ins before it. */
  readonly auth_time: number;
  readonly firebase: { readonly sign_in_provider: string };
  readonly [claim: string]: unknown;
}

/** The admin SDK's Auth (`getAuth(app)`), as far as checking ID tokens goes. */
export interface IdTokenAuth {
  verifyIdToken(token: string, checkRevoked?: boolean): Promise<DecodedIdToken>;
}

export interface CallerIdentity {
  readonly uid: string;
  /** The token's `firebase.sign_in_provider` ("anonymous" for anonymous accounts). */
  readonly signInProvider: string;
  /** The token's claims, custom claims included (`admin`, the pipelines an operator granted). */
  readonly claims: Readonly<Record<string, unknown>>;
}

export type VerifyCaller = (token: string) => Promise<CallerIdentity>;

/** How long a positive revocation check of a uid is reused. */
export const REVOCATION_CHECK_REUSE_MS = 5_000;
/** Uids whose last check is remembered per process; the oldest go first past it. */
const MAX_REMEMBERED_CHECKS = 10_000;

interface PassedCheck {
  readonly atMs: number;
  /** The sign-in time of the token that passed: revocation cuts off by sign-in time, so a token from an earlier sign-in proves nothing by it. */
  readonly authTimeSeconds: number;
}

/**
 * The verifier of every endpoint. Each call checks the token itself (signature, expiry, project);
 * whether its account is still in good standing is looked up unless a token of the same uid, from
 * the same sign-in or an earlier one, passed that lookup within the reuse window. A refusal is
 * never remembered.
 */
export function revocationCheckingVerifier(auth: IdTokenAuth, clock: Clock, reuseMs: number = REVOCATION_CHECK_REUSE_MS): VerifyCaller {
  const passed = new Map<string, PassedCheck>();
  return async (token) => {
    let decoded = await auth.verifyIdToken(token);
    const nowMs = clock.now();
    const last = passed.get(decoded.uid);
    const reusable = last !== undefined && nowMs - last.atMs < reuseMs && decoded.auth_time >= last.authTimeSeconds;
    if (!reusable) {
      decoded = await auth.verifyIdToken(token, true);
      passed.delete(decoded.uid);
      passed.set(decoded.uid, { atMs: nowMs, authTimeSeconds: decoded.auth_time });
      if (passed.size > MAX_REMEMBERED_CHECKS) {
        const oldest = passed.keys().next();
        if (!oldest.done) passed.delete(oldest.value);
      }
    }
    return { uid: decoded.uid, signInProvider: decoded.firebase.sign_in_provider, claims: decoded };
  };
}
