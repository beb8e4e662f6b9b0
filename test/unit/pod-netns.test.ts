import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { podUidFromCgroup, podUidsByNetns } from '../../src/k8s/pod-netns';

describe('pod network namespaces', () => {
  it('finds the pod UID in cgroup paths of both kubelet cgroup drivers', () => {
    assert.equal(
      podUidFromCgroup('0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b1c2d3e_4f50_6172_8394_a5b6c7d8e9f0.slice/cri-containerd-abc.scope\n'),
      '0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0',
    );
    assert.equal(podUidFromCgroup('0::/kubepods/besteffort/pod0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0/abc\n'), '0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0');
    assert.equal(podUidFromCgroup('0::/user.slice/user-0.slice/session-1.scope\n'), undefined);
  });

  it('maps namespace inodes to pod UIDs from a /proc tree', () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-proc-'));
    const proc = (pid: number, ino: number, cgroup: string) => {
      fs.mkdirSync(path.join(root, String(pid), 'ns'), { recursive: true });
      fs.symlinkSync(`net:[${ino}]`, path.join(root, String(pid), 'ns', 'net'));
      fs.writeFileSync(path.join(root, String(pid), 'cgroup'), cgroup);
    };
    proc(100, 4026532001, '0::/kubepods/burstable/pod11111111-2222-3333-4444-555555555555/c1\n');
    proc(101, 4026532001, '0::/kubepods/burstable/pod11111111-2222-3333-4444-555555555555/c2\n');
    proc(200, 4026531840, '0::/system.slice/kubelet.service\n');
    const m = podUidsByNetns(root);
    assert.equal(m.get(4026532001), '11111111-2222-3333-4444-555555555555');
    assert.equal(m.has(4026531840), false);
    fs.rmSync(root, { recursive: true, force: true });
  });
});
