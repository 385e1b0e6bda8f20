/**
 * The effect ledger as phases see it. Its model (states, entry schema, the owner-checked ledger
 * interface) is defined in core/effect-ledger.ts, below the step context that names it; this path
 * keeps the effects package's own imports.
 */
export * from '../core/effect-ledger';
