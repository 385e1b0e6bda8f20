/**
 * The public API (functions/src/api/index.ts, the package `phaseline`): every export is documented
 * where it is declared, and the factory refuses a bad registry with a clear error and builds the
 * functions under their fixed names from the registry it is given.
 */
import { join } from 'node:path';
import ts from 'typescript';
import { z } from 'zod';
import { createPhaseline, definePhase, definePipeline, type EffectAdapter, type StoppedEffectsSettler } from '../../functions/src/api';
import { deploymentOf } from '../../functions/src/api/create-phaseline';

const API_INDEX = join(__dirname, '..', '..', 'functions', 'src', 'api', 'index.ts');

/** The exports of a module that have no TSDoc where they are declared, read by the TypeScript checker (re-exports followed). */
function undocumentedExports(entry: string): { exports: string[]; undocumented: string[] } {
  const program = ts.createProgram([entry], { module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext, strict: true, skipLibCheck: true, noEmit: true });
  const checker = program.getTypeChecker();
  const source = program.getSourceFile(entry);
  const moduleSymbol = source && checker.getSymbolAtLocation(source);
  if (!moduleSymbol) throw new Error(`${entry} is not a module`);
  const exported = checker.getExportsOfModule(moduleSymbol);
  const undocumented = exported.filter((symbol) => {
    const declared = symbol.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(symbol) : symbol;
    return ts.displayPartsToString(declared.getDocumentationComment(checker)).trim() === '';
  });
  return { exports: exported.map((symbol) => symbol.name), undocumented: undocumented.map((symbol) => symbol.name).sort() };
}

describe('the public API', () => {
  test('every export has TSDoc where it is declared', () => {
    const { exports, undocumented } = undocumentedExports(API_INDEX);
    expect(exports).toEqual(expect.arrayContaining(['definePipeline', 'definePhase', 'createPhaseline', 'runAgentSection', 'defineTool', 'settleEffect', 'createAiSdkProvider']));
    expect(undocumented).toEqual([]);
  }, 120_000);

  test('the check finds an undocumented export', () => {
    // The probe's own source: `pipelineRegistry` documented, `undocumentedProbe` not.
    const probe = join(__dirname, '..', 'support', 'undocumented-export-probe.ts');
    expect(undocumentedExports(probe).undocumented).toEqual(['undocumentedProbe']);
  }, 120_000);
});

const input = z.strictObject({ n: z.number() });
const only = definePhase<{ n: number }, { n: number }>({ name: 'only', state: z.object({ n: z.number() }), run: (context) => Promise.resolve({ kind: 'done', state: { n: context.input.n } }) });
const pipelineNamed = (name: string) =>
  definePipeline<{ n: number }>({ name, description: name, input, phases: [only], publish: () => ({ outcome: 'complete', title: name, markdown: name, missing: [] }) });

describe('createPhaseline', () => {
  test('builds the six functions under their fixed names, the step runner with its queue settings', () => {
    const functions = createPhaseline({ pipelines: [pipelineNamed('first'), pipelineNamed('second')] });
    expect(Object.keys(functions).sort()).toEqual(['cancelJob', 'decideJob', 'opsAction', 'runJobStep', 'submitJob', 'sweepJobs']);
    expect(functions.runJobStep.__endpoint.taskQueueTrigger?.retryConfig).toMatchObject({ maxAttempts: 20, minBackoffSeconds: 2, maxBackoffSeconds: 300, maxDoublings: 8 });
    expect(functions.sweepJobs.__endpoint.scheduleTrigger).toMatchObject({ schedule: 'every 1 minutes' });
  });

  test('the triggers get the registry handed in, and the sweeper the settler each pipeline declared', () => {
    const adapter: EffectAdapter = { name: 'probe', apply: () => Promise.reject(new Error('unused')), lookup: () => Promise.reject(new Error('unused')) };
    const settler: StoppedEffectsSettler = { adapter };
    const deployment = deploymentOf({ pipelines: [pipelineNamed('first'), pipelineNamed('second')], effectsAfterStop: { second: () => settler } });
    expect([...deployment.pipelines.keys()]).toEqual(['first', 'second']);
    expect(deployment.settlerFor('second')).toBe(settler);
    expect(deployment.settlerFor('first')).toBeNull();
    expect(deployment.settlerFor('unknown')).toBeNull();
  });

  test.each([
    [{ pipelines: [] }, 'createPhaseline: `pipelines` must list at least one pipeline made with definePipeline'],
    [{ pipelines: [pipelineNamed('same'), pipelineNamed('same')] }, 'createPhaseline: two pipelines are named "same": each name must be unique'],
    [{ pipelines: [{ name: 'loose' }] }, 'createPhaseline: pipelines[0] is not a pipeline: make it with definePipeline'],
    [{ pipelines: [pipelineNamed('first')], effectsAfterStop: { frist: () => ({}) } }, 'createPhaseline: effectsAfterStop names "frist", which is none of the pipelines (first)'],
    [{ pipelines: [pipelineNamed('first')], effectsAfterStop: { first: {} } }, "createPhaseline: effectsAfterStop.first must be a function returning the pipeline's settler"],
  ])('refuses a bad option with a clear error (%#)', (options, message) => {
    expect(() => deploymentOf(options as unknown as Parameters<typeof deploymentOf>[0])).toThrow(message);
  });
});
