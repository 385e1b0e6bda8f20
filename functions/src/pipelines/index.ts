import type { Firestore } from 'firebase-admin/firestore';
import { systemClock } from '../core/clock';
import { pipelineRegistry, type PipelineRegistry } from '../core/pipeline';
import { firestoreArtifactStore } from '../store/artifact-store';
import { firestoreCircuit } from '../store/provider-circuit';
import { canaryPipeline } from './canary';
import { configuredNotifyDeps, createNotifyPipeline } from './notify';
import { sectionPolicyFromEnv } from '../config/environment';
import { configuredProvider } from './providers';
import { createResearchPipeline, type ResearchDeps } from './research';
import { createTriagePipeline, helpdeskFromEffectAdapter, triageStoppedEffects, type TriageDeps } from './triage';
import type { StoppedEffectsDeps } from '../engine/settle-stopped';
import { notifyStoppedEffects } from './notify/config';

/**
 * Every pipeline the deployed functions accept, by name. Firestore comes from the caller (the
 * triggers' backends: pipelines do not import triggers/); provider configuration and Firestore are
 * only touched when a research or triage step first runs.
 */
export function deployedPipelines(firestore: () => Firestore): PipelineRegistry {
  let researchDeps: ResearchDeps | undefined;
  const resolveResearchDeps = (): ResearchDeps => {
    if (!researchDeps) {
      const { provider, toolbox } = configuredProvider(systemClock, process.env, { artifacts: firestoreArtifactStore(firestore(), systemClock) });
      researchDeps = { provider, toolbox, circuit: firestoreCircuit(firestore(), provider.name), policy: sectionPolicyFromEnv(process.env) };
    }
    return researchDeps;
  };
  // Triage shares research's model and circuit; its tickets go to the receiver notify sends to.
  let triageDeps: TriageDeps | undefined;
  const resolveTriageDeps = (): TriageDeps => {
    if (!triageDeps) {
      const { provider, circuit, policy } = resolveResearchDeps();
      triageDeps = { provider, helpdesk: helpdeskFromEffectAdapter(configuredNotifyDeps().adapter), ...(circuit ? { circuit } : {}), ...(policy ? { policy } : {}) };
    }
    return triageDeps;
  };
  return pipelineRegistry(canaryPipeline, createResearchPipeline(resolveResearchDeps), createNotifyPipeline(configuredNotifyDeps), createTriagePipeline(resolveTriageDeps));
}

/** How the sweeper checks the effects of a stopped job, for every deployed pipeline that has effects (notify's messages, triage's tickets). */
export function deployedStoppedEffects(): StoppedEffectsDeps['settlerFor'] {
  const notify = notifyStoppedEffects();
  const triage = triageStoppedEffects(() => helpdeskFromEffectAdapter(configuredNotifyDeps().adapter));
  return (pipeline) => notify(pipeline) ?? triage(pipeline);
}
