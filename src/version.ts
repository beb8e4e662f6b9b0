/** svctrace's version, from package.json. */
// eslint-disable-next-line @typescript-eslint/no-require-imports
export const VERSION: string = (require('../../package.json') as { version: string }).version;
