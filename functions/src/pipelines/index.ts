/**
 * The pipelines this repository deploys (functions/src/index.ts hands them to createPhaseline).
 * Provider configuration and Firestore are only touched when a research or triage step first runs.
 */
import type { Firestore } from 'firebase-admin/firestore';
import {
  firestoreArtifactStore,
  firestoreCircuit,
  phaselineFirestore,
  pipelineRegistry,
  sectionPolicyFromEnv,
  systemClock,
  type PipelineRegistry,
  type StoppedEffectsSettler,
} from '../api';
import { canaryPipeline } from './canary';
import { configuredNotifyDeps, createNotifyPipeline, notifyEffectsAfterStop } from './notify';
import { configuredProvider } from './providers';
import { createResearchPipeline, type ResearchDeps } from './research';
import { createTriagePipeline, helpdeskFromEffectAdapter, TRIAGE_PIPELINE, triageStoppedEffects, type TriageDeps } from './triage';

export { canaryPipeline } from './canary';
export { notifyEffectsAfterStop } from './notify';

/** The research pipeline's backends, from configuration and the given Firestore, built when a step first needs them. */
function researchDepsFrom(firestore: () => Firestore): () => ResearchDeps {
  let researchDeps: ResearchDeps | undefined;
  return () => {
    if (!researchDeps) {
      const { provider, toolbox } = configuredProvider(systemClock, process.env, { artifacts: firestoreArtifactStore(firestore(), systemClock) });
      researchDeps = { provider, toolbox, circuit: firestoreCircuit(firestore(), provider.name), policy: sectionPolicyFromEnv(process.env) };
    }
    return researchDeps;
  };
}

/** Triage shares research's model and circuit; its tickets go to the receiver notify sends to. */
function triageDepsFrom(research: () => ResearchDeps): () => TriageDeps {
  let triageDeps: TriageDeps | undefined;
  return () => {
    if (!triageDeps) {
      const { provider, circuit, policy } = research();
      triageDeps = { provider, helpdesk: helpdeskFromEffectAdapter(configuredNotifyDeps().adapter), ...(circuit ? { circuit } : {}), ...(policy ? { policy } : {}) };
    }
    return triageDeps;
  };
}

function deployedSet(firestore: () => Firestore) {
  const research = researchDepsFrom(firestore);
  return { research: createResearchPipeline(research), triage: createTriagePipeline(triageDepsFrom(research)) };
}

const onDeployedFirestore = deployedSet(phaselineFirestore);

/** `research`, on the deployed functions' Firestore. */
export const researchPipeline = onDeployedFirestore.research;

/** `notify`, sending through the configured receiver. */
export const notifyPipeline = createNotifyPipeline(configuredNotifyDeps);

/** `triage`, on the deployed functions' Firestore and model, filing tickets with the configured receiver. */
export const triagePipeline = onDeployedFirestore.triage;

/** How the sweeper checks a stopped triage job's tickets: looked up in the helpdesk they were filed with. */
export function triageEffectsAfterStop(): StoppedEffectsSettler {
  const settler = triageStoppedEffects(() => helpdeskFromEffectAdapter(configuredNotifyDeps().adapter))(TRIAGE_PIPELINE);
  if (settler === null) throw new Error('triage has no stopped-effects settler');
  return settler;
}

/** Every deployed pipeline by name, reading Firestore through `firestore` (for tools that run them outside the functions). */
export function deployedPipelines(firestore: () => Firestore): PipelineRegistry {
  const { research, triage } = deployedSet(firestore);
  return pipelineRegistry(canaryPipeline, research, notifyPipeline, triage);
}

/** How the sweeper checks a stopped job's effects, for every deployed pipeline that has effects (for tools that sweep outside the functions). */
export function deployedStoppedEffects(): (pipeline: string) => StoppedEffectsSettler | null {
  const settlers: Readonly<Record<string, () => StoppedEffectsSettler>> = { notify: notifyEffectsAfterStop, [TRIAGE_PIPELINE]: triageEffectsAfterStop };
  return (pipeline) => settlers[pipeline]?.() ?? null;
}
