export { createResearchPipeline, researchInput, listItems, type ResearchInput } from './pipeline';
export type { ResearchDeps } from './agent-section';
