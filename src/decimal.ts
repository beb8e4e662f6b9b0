/**
 * A number as a person writes one in a flag: decimal digits with an
 * optional fraction. NaN for anything else, so that the flag's own range
 * check refuses it: Number() alone took '0x10', '0b11', '1e3', ' 5 ', '-0'
 * and '' (0) as numbers.
 */
const DECIMAL = /^\d+(\.\d+)?$/;

export function parseDecimal(text: string): number {
  return DECIMAL.test(text) ? Number(text) : NaN;
}
