/**
 * The pipelines this repository deploys (functions/src/index.ts hands them to createPhaseline).
 * Provider configuration and Firestore are only touched when a research step first runs.
 */
import type { Firestore } from 'firebase-admin/firestore';
import { firestoreArtifactStore, firestoreCircuit, phaselineFirestore, pipelineRegistry, sectionPolicyFromEnv, systemClock, type PipelineRegistry } from '../api';
import { canaryPipeline } from './canary';
import { configuredNotifyDeps, createNotifyPipeline } from './notify';
import { configuredProvider } from './providers';
import { createResearchPipeline, type ResearchDeps } from './research';

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

/** `research`, on the deployed functions' Firestore. */
export const researchPipeline = createResearchPipeline(researchDepsFrom(phaselineFirestore));

/** `notify`, sending through the configured receiver. */
export const notifyPipeline = createNotifyPipeline(configuredNotifyDeps);

/** Every deployed pipeline by name, reading Firestore through `firestore` (for tools that run them outside the functions). */
export function deployedPipelines(firestore: () => Firestore): PipelineRegistry {
  return pipelineRegistry(canaryPipeline, createResearchPipeline(researchDepsFrom(firestore)), notifyPipeline);
}
