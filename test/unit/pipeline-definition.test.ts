/** Pipeline definitions are checked once, when they are defined; resume is decided by stored state. */
import { z } from 'zod';
import {
  defineFanOutPhase,
  definePhase,
  definePipeline,
  pipelineRegistry,
  resumePhaseIndex,
  type PhaseDefinition,
  type PipelineDefinition,
} from '../../functions/src/core/pipeline';

type Input = { topic: string };
type Phase = PhaseDefinition<Input, unknown>;

const input = z.strictObject({ topic: z.string().min(1) });
const publish = () => ({ outcome: 'complete' as const, title: 'T', markdown: '', missing: [] });

function plain(name: string, needs: readonly Phase[] = []): Phase {
  return definePhase<Input, { name: string }>({
    name,
    state: z.object({ name: z.string() }),
    needs,
    run: () => Promise.resolve({ kind: 'done', state: { name } }),
  });
}

function fanOut(name: string, needs: readonly Phase[] = []): Phase {
  return defineFanOutPhase<Input, { count: number }, { ok: boolean }>({
    name,
    state: z.object({ count: z.number() }),
    needs,
    fanOut: {
      units: () => ['u1', 'u2'],
      unitState: z.object({ ok: z.boolean() }),
      runUnit: () => Promise.resolve({ kind: 'done', state: { ok: true } }),
      join: (results) => ({ count: results.size }),
    },
  });
}

function pipeline(phases: readonly Phase[], name = 'research'): PipelineDefinition<Input> {
  return definePipeline<Input>({ name, description: 'test', input, phases, publish });
}

describe('definePipeline', () => {
  test('accepts a well-formed pipeline and returns it unchanged', () => {
    const gather = plain('gather');
    const experts = fanOut('experts', [gather]);
    const draft = plain('draft-2', [gather, experts]);
    const definition = { name: 'research', description: 'ok', input, phases: [gather, experts, draft], publish };
    expect(definePipeline<Input>(definition)).toBe(definition);
  });

  test('accepts a pipeline with no phases', () => {
    expect(pipeline([]).phases).toEqual([]);
  });

  test('rejects a phase name used twice', () => {
    expect(() => pipeline([plain('gather'), plain('draft'), plain('gather')])).toThrow(
      'Pipeline research: phase gather is defined twice',
    );
  });

  test('rejects a duplicate even when the two phases differ in kind', () => {
    expect(() => pipeline([plain('work'), fanOut('work')])).toThrow(/work is defined twice/);
  });

  test.each(['Gather', 'draftSection', 'draft_section', '2-draft', '-draft', 'draft section', '', 'dräft'])(
    'rejects the non-kebab phase name %j',
    (name) => {
      expect(() => pipeline([plain(name)])).toThrow(/must be kebab-case/);
    },
  );

  test('rejects a phase name over 64 characters: unit tasks name their phase and would be refused', () => {
    expect(() => pipeline([plain('a'.repeat(65))])).toThrow(/must be kebab-case, at most 64 characters/);
    expect(pipeline([plain('a'.repeat(64))]).phases).toHaveLength(1);
  });

  test.each(['a', 'gather', 'draft-2', 'step-by-step', 'x9'])('accepts the kebab phase name %j', (name) => {
    expect(pipeline([plain(name)]).phases).toHaveLength(1);
  });

  test('rejects a phase with neither run nor fanOut', () => {
    const neither = definePhase<Input, { name: string }>({ name: 'idle', state: z.object({ name: z.string() }) });
    expect(() => pipeline([plain('gather'), neither])).toThrow('Pipeline research: phase idle needs exactly one of run or fanOut');
  });

  test('rejects a phase with both run and fanOut', () => {
    const both = definePhase<Input, { count: number }>({
      name: 'both',
      state: z.object({ count: z.number() }),
      run: () => Promise.resolve({ kind: 'yield' }),
      fanOut: {
        units: () => [],
        unitState: z.unknown(),
        runUnit: () => Promise.resolve({ kind: 'yield' }),
        join: () => ({ count: 0 }),
      },
    });
    expect(() => pipeline([both])).toThrow(/phase both needs exactly one of run or fanOut/);
  });

  test('rejects a phase that needs a later phase', () => {
    const draft = plain('draft');
    const gather = plain('gather', [draft]);
    expect(() => pipeline([gather, draft])).toThrow('Pipeline research: phase gather needs draft, which does not come before it');
  });

  test('rejects a phase that needs itself', () => {
    const loop: Phase = { ...plain('loop'), needs: [] };
    const selfNeeding: Phase = { ...loop, needs: [loop] };
    expect(() => pipeline([selfNeeding])).toThrow(/phase loop needs loop, which does not come before it/);
  });

  test('rejects a phase that needs a phase outside the pipeline', () => {
    const elsewhere = plain('elsewhere');
    expect(() => pipeline([plain('gather'), plain('draft', [elsewhere])])).toThrow(/draft needs elsewhere/);
  });

  test('the pipeline name is in the message', () => {
    expect(() => pipeline([plain('x'), plain('x')], 'weekly-report')).toThrow(/^Pipeline weekly-report:/);
  });
});

describe('resumePhaseIndex', () => {
  const research = pipeline([plain('a'), plain('b'), plain('c')]);

  test.each([
    [[], 0],
    [['a'], 1],
    [['a', 'b'], 2],
    [['a', 'b', 'c'], 3],
    [['a', 'c'], 1],
    [['b', 'c'], 0],
    [['c'], 0],
    [['b'], 0],
    [['a', 'b', 'c', 'unrelated'], 3],
    [['unrelated'], 0],
  ])('with valid checkpoints %j resumes at phase index %i', (checkpoints, index) => {
    expect(resumePhaseIndex(research, new Set(checkpoints))).toBe(index);
  });

  test('a pipeline without phases is already finished', () => {
    expect(resumePhaseIndex(pipeline([]), new Set())).toBe(0);
  });
});

describe('pipelineRegistry', () => {
  test('maps each pipeline by its name', () => {
    const first = pipeline([plain('a')], 'first');
    const second = definePipeline<{ n: number }>({
      name: 'second',
      description: 'numbers',
      input: z.object({ n: z.number() }),
      phases: [definePhase<{ n: number }, number>({ name: 'double', state: z.number(), run: (context) => Promise.resolve({ kind: 'done', state: context.input.n * 2 }) })],
      publish,
    });
    const registry = pipelineRegistry(first, second);
    expect(registry.size).toBe(2);
    expect(registry.get('first')).toBe(first);
    expect(registry.get('second')).toBe(second);
    expect(registry.get('third')).toBeUndefined();
    expect([...registry.keys()]).toEqual(['first', 'second']);
  });

  test('an empty registry knows no pipelines', () => {
    expect(pipelineRegistry().size).toBe(0);
  });
});
