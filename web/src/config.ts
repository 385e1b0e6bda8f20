/** Where the emulators are: /config.json, written by whoever serves the page (npm start, the browser test). */
export interface PageConfig {
  readonly projectId: string;
  readonly apiKey: string;
  readonly functionsBaseUrl: string;
  readonly authEmulatorUrl: string;
  readonly firestoreHost: string;
  readonly firestorePort: number;
}

function requireString(source: Readonly<Record<string, unknown>>, name: string): string {
  const value = source[name];
  if (typeof value !== 'string' || value === '') throw new Error(`/config.json: ${name} must be a non-empty string`);
  return value;
}

export function parseConfig(value: unknown): PageConfig {
  if (typeof value !== 'object' || value === null) throw new Error('/config.json must hold a JSON object');
  const source = value as Readonly<Record<string, unknown>>;
  const port = source.firestorePort;
  if (typeof port !== 'number' || !Number.isInteger(port) || port <= 0) throw new Error('/config.json: firestorePort must be a port number');
  return {
    projectId: requireString(source, 'projectId'),
    apiKey: requireString(source, 'apiKey'),
    functionsBaseUrl: requireString(source, 'functionsBaseUrl').replace(/\/+$/, ''),
    authEmulatorUrl: requireString(source, 'authEmulatorUrl'),
    firestoreHost: requireString(source, 'firestoreHost'),
    firestorePort: port,
  };
}

export async function loadConfig(): Promise<PageConfig> {
  const response = await fetch('/config.json', { cache: 'no-store' });
  if (!response.ok) throw new Error(`/config.json answered ${response.status}`);
  return parseConfig(await response.json());
}
