import { systemClock } from '../core/clock';
import { pipelineRegistry } from '../core/pipeline';
import { firestoreCircuit } from '../store/provider-circuit';
import { firestore } from '../triggers/admin';
import { canaryPipeline } from './canary';
import { configuredNotifyDeps, createNotifyPipeline } from './notify';
import { configuredProvider } from './providers';
import { createResearchPipeline, type ResearchDeps } from './research';

let researchDeps: ResearchDeps | undefined;

/** Built on first use: provider configuration and Firestore are only touched when a step runs. */
function resolveResearchDeps(): ResearchDeps {
  if (!researchDeps) {
    const { provider, toolbox } = configuredProvider(systemClock);
    researchDeps = { provider, toolbox, circuit: firestoreCircuit(firestore(), provider.name) };
  }
  return researchDeps;
}

/** Every pipeline the deployed functions accept, by name. */
export const pipelines = pipelineRegistry(canaryPipeline, createResearchPipeline(resolveResearchDeps), createNotifyPipeline(configuredNotifyDeps));
