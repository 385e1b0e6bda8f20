/**
 * The step a piece of work belongs to, carried through every await of one task request
 * (AsyncLocalStorage): its job, step, unit, epoch and phase, its span, and the tracer that made it.
 * Log lines and child spans (model calls, tool calls, commits) read it, so the code that makes them
 * needs no parameter for it. Epoch and phase become known as the step goes: the claim's commit
 * names the epoch (commits.ts), the claimed record the phase.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { trace, type Attributes, type Span, type Tracer } from '@opentelemetry/api';
import type { IncomingTrace } from './trace-headers';

/** The instrumentation's name, as spans report it. */
export const TRACER_NAME = 'phaseline';

/** Attribute names on every span of a step (and, without the prefix, fields of every log line). */
export const STEP_ATTRIBUTES = {
  jobId: 'phaseline.job_id',
  step: 'phaseline.step',
  unit: 'phaseline.unit',
  epoch: 'phaseline.epoch',
  phase: 'phaseline.phase',
} as const;

export interface StepFields {
  readonly jobId?: string;
  readonly step?: number;
  readonly unit?: string;
  readonly epoch?: number;
  readonly phase?: string;
}

export class StepScope {
  private current: StepFields;

  constructor(
    readonly span: Span,
    readonly tracer: Tracer,
    fields: StepFields,
    /** The request's own trace header, when it had a valid one. */
    readonly incoming: IncomingTrace | null,
  ) {
    this.current = { ...fields };
  }

  get fields(): StepFields {
    return this.current;
  }

  /** Adds what the step has learnt (its epoch, its phase); the step span carries it too. */
  annotate(fields: StepFields): void {
    this.current = { ...this.current, ...definedFields(fields) };
    this.span.setAttributes(stepAttributes(fields));
  }
}

function definedFields(fields: StepFields): StepFields {
  return Object.fromEntries(Object.entries(fields).filter(([, value]) => value !== undefined));
}

/** The span attributes of a step's fields (unknown ones left out). */
export function stepAttributes(fields: StepFields | undefined): Attributes {
  const attributes: Attributes = {};
  if (!fields) return attributes;
  for (const [field, name] of Object.entries(STEP_ATTRIBUTES) as [keyof StepFields, string][]) {
    const value = fields[field];
    if (value !== undefined) attributes[name] = value;
  }
  return attributes;
}

const storage = new AsyncLocalStorage<StepScope>();

/** The step the caller runs in, if any. */
export function currentStep(): StepScope | undefined {
  return storage.getStore();
}

export function runInStep<T>(scope: StepScope, run: () => T): T {
  return storage.run(scope, run);
}

/** Tells the current step (if any) what it has learnt; nothing outside a step. */
export function annotateStep(fields: StepFields): void {
  storage.getStore()?.annotate(fields);
}

/** The current step's tracer, else the global one (a no-op until a provider is registered). */
export function currentTracer(): Tracer {
  return storage.getStore()?.tracer ?? trace.getTracer(TRACER_NAME);
}
