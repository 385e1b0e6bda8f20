/**
 * What the triggers are built from: the pipelines a project deploys and how their effects are
 * checked after a job stopped. Handed in by the public factory (api/create-phaseline.ts); no
 * trigger imports a pipeline.
 */
import type { PipelineRegistry } from '../core/pipeline';
import type { StoppedEffectsDeps } from '../engine/settle-stopped';

export interface Deployment {
  readonly pipelines: PipelineRegistry;
  /** The settler of a pipeline with external effects, null for the others (the sweeper asks it after a job stopped). */
  readonly settlerFor: StoppedEffectsDeps['settlerFor'];
}
