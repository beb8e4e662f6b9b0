import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import os from 'node:os';
import { nodeName } from '../../src/node-name';

describe('node name', () => {
  it('is NODE_NAME (the downward API\'s spec.nodeName) when set, else the host name', () => {
    assert.equal(nodeName({ NODE_NAME: 'worker-3' }), 'worker-3');
    assert.equal(nodeName({ NODE_NAME: '  ' }), os.hostname());
    assert.equal(nodeName({}), os.hostname());
  });
});
