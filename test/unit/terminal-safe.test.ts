import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { terminalSafe, terminalSafeLine } from '../../src/output/terminal-safe';

describe('terminalSafe', () => {
  it('shows control characters from outside as escapes: no colour, title, cursor or clear', () => {
    assert.equal(terminalSafe('svctrace \x1b[31mred\x1b[0m'), 'svctrace \\x1b[31mred\\x1b[0m');
    assert.equal(terminalSafe('title \x1b]0;owned\x07'), 'title \\x1b]0;owned\\x07');
    assert.equal(terminalSafe('8-bit CSI \x9b2J and DEL \x7f'), '8-bit CSI \\x9b2J and DEL \\x7f');
    assert.equal(terminalSafe('back\rover'), 'back\\x0dover');
  });

  it('leaves text, tabs, non-ASCII names and (in multi-line text) newlines as they are', () => {
    const text = 'recording a.svtr\n  services: 10.96.0.100:80/tcp\tpod café-0 ✓';
    assert.equal(terminalSafe(text), text);
    assert.equal(terminalSafe(''), '');
  });

  it('one line per record: a newline inside it cannot forge a line', () => {
    assert.equal(terminalSafeLine('[flow 1] x\nOK: complete'), '[flow 1] x\\x0aOK: complete');
    assert.equal(terminalSafeLine('a\tb'), 'a\tb');
    // Twice in a row (a global pattern keeps state between calls; these must not).
    assert.equal(terminalSafeLine('\x1b'), '\\x1b');
    assert.equal(terminalSafeLine('\x1b'), '\\x1b');
  });
});
