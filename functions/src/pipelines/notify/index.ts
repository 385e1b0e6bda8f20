export * from './pipeline';
export * from './plan';
export * from './counts';
export * from './config';
