/** What a Firestore error's gRPC code says about retrying it. */

/** gRPC codes worth retrying a write for: aborted, deadline exceeded, resource exhausted, unavailable. */
const TRANSIENT_GRPC_CODES = new Set([4, 8, 10, 14]);

export function isTransientFirestoreError(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'number' && TRANSIENT_GRPC_CODES.has(code);
}

/** gRPC ALREADY_EXISTS: a `create` found its document there. */
export function isAlreadyExists(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 6;
}

/** gRPC FAILED_PRECONDITION: a write's update-time (or existence) precondition did not hold. */
export function isFailedPrecondition(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 9;
}
