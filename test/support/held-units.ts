/**
 * A fan-out pipeline whose units a test holds and releases (`turns.run` decides what each unit
 * does), and gates to hold a worker at a chosen point: the fencing, ended-fan-out and heartbeat
 * tests build their interleavings from these.
 */
import { z } from 'zod';
import { defineFanOutPhase, definePipeline, type PipelineDefinition, type StepContext, type UnitOutcome } from '../../functions/src/core/pipeline';
import { gate } from './engine';

export type UnitInput = { units: number };
export type UnitResult = { value: number };
export type UnitTurn = (context: StepContext<UnitInput>, unit: string) => Promise<UnitOutcome<UnitResult>>;

export const unitFinished = { kind: 'done', state: { value: 1 } } as const;

export interface HeldUnits {
  readonly pipeline: PipelineDefinition<UnitInput>;
  /** What the next unit step runs; `reset` puts back a unit that just finishes. */
  readonly turns: { run: UnitTurn; reset(): void };
}

export interface UnitsPipelineSpec {
  /** The fan-out phase's name: `experts` unless given. */
  readonly phase?: string;
  /** The most units an input may ask for: 3 unless given. */
  readonly maxUnits?: number;
  readonly description?: string;
  /** The unit IDs for `count` units: `u0`, `u1`… unless given. */
  readonly unitIds?: (count: number) => string[];
  readonly publish?: PipelineDefinition<UnitInput>['publish'];
}

/** One fan-out phase whose units run `runUnit`, joined into the total of their values: the fan-out tests' pipelines. */
export function unitsPipeline(name: string, runUnit: UnitTurn, spec: UnitsPipelineSpec = {}): PipelineDefinition<UnitInput> {
  const unitIds = spec.unitIds ?? ((count: number) => Array.from({ length: count }, (_, index) => `u${index}`));
  return definePipeline<UnitInput>({
    name,
    description: spec.description ?? 'Test pipeline: one fan-out phase whose units the test sets',
    input: z.strictObject({ units: z.number().int().min(1).max(spec.maxUnits ?? 3) }),
    phases: [
      defineFanOutPhase<UnitInput, { total: number }, UnitResult>({
        name: spec.phase ?? 'experts',
        state: z.strictObject({ total: z.number() }),
        section: z.strictObject({ value: z.number() }),
        fanOut: {
          units: (context) => unitIds(context.input.units),
          unitState: z.strictObject({ value: z.number() }),
          runUnit,
          join: (results) => ({ total: [...results.values()].reduce((sum, result) => sum + result.value, 0) }),
        },
      }),
    ],
    publish: spec.publish ?? (() => ({ outcome: 'complete', title: 'Total', markdown: 'units joined', missing: [] })),
  });
}

/** One fan-out phase `experts` with units `u0`… (`input.units` of them, at most `maxUnits`), joined into their total. */
export function heldUnitsPipeline(name: string, maxUnits = 3): HeldUnits {
  const finish: UnitTurn = () => Promise.resolve(unitFinished);
  const turns = {
    run: finish,
    reset() {
      turns.run = finish;
    },
  };
  const pipeline = unitsPipeline(name, (context, unit) => turns.run(context, unit), { maxUnits, description: 'Test pipeline: one fan-out phase whose units the test holds and releases' });
  return { pipeline, turns };
}

export interface Hold {
  /** Resolves once the worker has reached the hold. */
  readonly entered: Promise<void>;
  arrive(): void;
  readonly released: Promise<void>;
  release(): void;
}

export function hold(): Hold {
  const entered = gate();
  const released = gate();
  return { entered: entered.promise, arrive: entered.open, released: released.promise, release: released.open };
}

/** Arrives at the hold, waits to be released, then does `then`. */
export async function holdThen<T>(at: Hold, then: () => Promise<T>): Promise<T> {
  at.arrive();
  await at.released;
  return then();
}
