/** The deployed functions: this repository's pipelines through the public factory, as any project's are. */
import { createPhaseline } from './api';
import { canaryPipeline, notifyEffectsAfterStop, notifyPipeline, researchPipeline, triageEffectsAfterStop, triagePipeline } from './pipelines';

export const { submitJob, runJobStep, sweepJobs, cancelJob, decideJob, opsAction } = createPhaseline({
  pipelines: [canaryPipeline, researchPipeline, notifyPipeline, triagePipeline],
  effectsAfterStop: { notify: notifyEffectsAfterStop, triage: triageEffectsAfterStop },
});
