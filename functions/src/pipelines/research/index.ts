export { createResearchPipeline, researchInput, listItems, type ResearchDeps, type ResearchInput } from './pipeline';
