/** A module for test/unit/public-api.test.ts: one documented re-export, one undocumented export. */
export { pipelineRegistry } from '../../functions/src/core/pipeline';
export const undocumentedProbe = 1;
