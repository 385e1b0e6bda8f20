export * from './pipeline';
export * from './config';
