export { submitJob } from './triggers/submit-job';
export { runJobStep } from './triggers/run-job-step';
export { sweepJobs } from './triggers/sweep-jobs';
export { cancelJob, decideJob } from './triggers/job-actions';
export { opsAction } from './triggers/ops';
