/** Pipeline definitions are checked once, when they are defined; resume is decided by stored state. */
import { z } from 'zod';
import {
  defineFanOutPhase,
  definePhase,
  definePipeline,
  grantedPipelinesOf,
  PIPELINE_GRANTS_CLAIM,
  pipelineAccessRefusal,
  pipelineRegistry,
  resumePhaseIndex,
  type PhaseDefinition,
  type PipelineAccess,
  type PipelineDefinition,
} from '../../functions/src/core/pipeline';
import { deployedPipelines } from '../../functions/src/pipelines';

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

describe('access', () => {
  const anonymous = { uid: 'u1', anonymous: true, grantedPipelines: new Set(['p']) };
  const signedIn = { uid: 'u2', anonymous: false, grantedPipelines: new Set<string>() };
  const granted = { uid: 'u3', anonymous: false, grantedPipelines: new Set(['p']) };
  const grantedOther = { uid: 'u4', anonymous: false, grantedPipelines: new Set(['other']) };

  test.each<[PipelineAccess | undefined, boolean[]]>([
    [undefined, [true, true, true, true]],
    ['anyone', [true, true, true, true]],
    ['signed-in', [false, true, true, true]],
    ['granted', [false, false, true, false]],
  ])('access %s lets in: anonymous, signed-in, granted it, granted another = %j', (access, allowed) => {
    const pipeline = { name: 'p', ...(access ? { access } : {}) };
    expect([anonymous, signedIn, granted, grantedOther].map((caller) => pipelineAccessRefusal(pipeline, caller) === null)).toEqual(allowed);
  });

  test('bug 29: the deployed notify pipeline is for accounts an operator granted it; research and canary stay open', () => {
    const deployed = deployedPipelines(() => {
      throw new Error('no Firestore here');
    });
    expect(Object.fromEntries([...deployed].map(([name, pipeline]) => [name, pipeline.access ?? 'anyone']))).toEqual({ canary: 'anyone', research: 'anyone', notify: 'granted', triage: 'signed-in' });
  });

  test('the grants are the claim\'s strings; any other value grants nothing', () => {
    expect([...grantedPipelinesOf({ [PIPELINE_GRANTS_CLAIM]: ['notify', 7, 'research'] })]).toEqual(['notify', 'research']);
    expect(grantedPipelinesOf({ [PIPELINE_GRANTS_CLAIM]: 'notify' }).size).toBe(0);
    expect(grantedPipelinesOf(undefined).size).toBe(0);
  });

  test('an access level that does not exist is refused when the pipeline is defined', () => {
    expect(() => definePipeline({ name: 'p', description: '', input, phases: [plain('a')], publish, access: 'admins' as PipelineAccess })).toThrow(
      'Pipeline p: access must be one of anyone, signed-in, granted, not admins',
    );
  });
});
