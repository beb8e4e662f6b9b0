import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { formatIPv4, parseIPv4, parseNodePortSpec, parseServiceSpec } from '../../src/net/ipv4';
import { SvctraceError } from '../../src/errors';

function badInput(fn: () => unknown, re: RegExp): void {
  assert.throws(fn, (e: unknown) => e instanceof SvctraceError && e.code === 'BAD_INPUT' && re.test(e.message));
}

describe('parseIPv4', () => {
  it('round-trips', () => {
    assert.equal(formatIPv4(parseIPv4('10.96.0.100')), '10.96.0.100');
    assert.equal(parseIPv4('255.255.255.255'), 0xffffffff);
  });
  it('rejects junk', () => {
    for (const s of ['', '10.96.0', '10.96.0.256', '1.2.3.4.5', 'a.b.c.d', '01.2.3.4', '10.96.0.100 ']) {
      badInput(() => parseIPv4(s), /not an IPv4 address/);
    }
  });
});

describe('parseServiceSpec', () => {
  it('parses IP:port with tcp by default', () => {
    const s = parseServiceSpec('10.96.0.100:80');
    assert.equal(s.address, '10.96.0.100');
    assert.equal(s.port, 80);
    assert.equal(s.proto, 'tcp');
    assert.equal(s.protoNumber, 6);
  });
  it('parses /udp', () => {
    assert.equal(parseServiceSpec('10.96.0.10:53/udp').protoNumber, 17);
    assert.equal(parseServiceSpec('10.96.0.10:53/UDP').proto, 'udp');
  });
  it('rejects bad specs with a message naming the problem', () => {
    badInput(() => parseServiceSpec('10.96.0.100'), /IP:port/);
    badInput(() => parseServiceSpec('10.96.0.100:0'), /1-65535/);
    badInput(() => parseServiceSpec('10.96.0.100:70000'), /1-65535/);
    badInput(() => parseServiceSpec('10.96.0.100:80/icmp'), /tcp, udp or sctp/);
    // Names every object has are not protocols either.
    for (const p of ['constructor', '__proto__', 'toString', 'hasOwnProperty']) badInput(() => parseServiceSpec(`10.96.0.100:80/${p}`), /tcp, udp or sctp/);
    badInput(() => parseServiceSpec('web:80'), /not an IPv4 address/);
  });
});

describe('parseNodePortSpec', () => {
  it('parses a port and matches any address', () => {
    const s = parseNodePortSpec('30080');
    assert.equal(s.address, null);
    assert.equal(s.port, 30080);
  });
  it('rejects non-numbers', () => {
    badInput(() => parseNodePortSpec('http'), /1-65535/);
  });
});
