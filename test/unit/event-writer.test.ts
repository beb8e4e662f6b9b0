/**
 * EventWriter (src/stream/event-writer.ts) must write exactly the bytes
 * protobufjs's own Writer writes for the same generated encoder calls: the
 * wire format is the .proto's, only the writer is ours.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import protobuf from 'protobufjs/minimal';
import Long from 'long';
import { svctrace } from '../../src/gen/svctrace';
import { EventWriter } from '../../src/stream/event-writer';
import { encodeEvents, eventBytes } from '../../src/stream/frames';
import { makeEvent } from '../helpers/stream';

import pb = svctrace.v1;

const BATCH_EVENT_TAG = (1 << 3) | 2;

/** What protobufjs writes for one event as an EventBatch.events field. */
function reference(ev: pb.IEvent): Uint8Array {
  return pb.Event.encode(ev, protobuf.Writer.create().uint32(BATCH_EVENT_TAG).fork()).ldelim().finish();
}

const tuple = (src: string, srcPort: number): pb.ITuple => ({ src, dst: '10.96.0.100', srcPort, dstPort: 80, protocol: pb.Protocol.PROTOCOL_TCP });

/** Every field of Event and of the messages in it, with values that take the writer's rare paths. */
const everything: pb.IEvent = {
  tsNs: Long.fromBits(0x89abcdef, 0x1789abcd, true),
  kind: pb.EventKind.EVENT_KIND_DROP,
  flowId: 2 ** 40 + 7,
  service: '10.96.0.100:80/tcp',
  stage: pb.Stage.STAGE_DROP,
  summary: 'dropped — «NETFILTER_DROP» at eth0 ✓ 🙂 '.repeat(6),
  direction: pb.Direction.DIRECTION_REPLY,
  packet: tuple('10.244.1.1', 40000),
  length: 1500,
  tcpFlags: 'SYN|ACK',
  conntrack: {
    id: 'ffff888812345600',
    original: tuple('10.250.0.2', 58522),
    reply: tuple('10.244.1.12', 8080),
    status: 0x1ba,
    statusNames: ['SEEN_REPLY', 'ASSURED', 'CONFIRMED'],
    tcpState: 'ESTABLISHED',
    mark: 0xffffffff,
    zone: 3,
    timeoutMs: 431_999_000,
    tcpStateBefore: 'SYN_RECV',
  },
  device: { ifindex: 7, name: 'veth2', kind: 'veth', netnsInode: 4026532456, netns: 'pod пример', podSide: true },
  hook: pb.NfHook.NF_HOOK_POST_ROUTING,
  priority: -101,
  afterNat: true,
  dropReason: 6,
  dropReasonName: 'NETFILTER_DROP',
  gateway: '10.0.0.1',
  routeTable: 254,
  icmpType: 3,
  icmpCode: 1,
  cpu: 1,
  backend: '10.244.1.12:8080',
  backendNetns: 'svt-lab-pod2',
  packetData: Uint8Array.from({ length: 300 }, (_, i) => i & 0xff),
  benignDrop: true,
  rulePath: ['KUBE-SERVICES', 'KUBE-SVC-CDGGSHYLG3RE2FKL', 'KUBE-SEP-BQ6CYJXGREWSNKJL'],
  serviceName: 'default/web:http',
  backendPod: 'default/web-7d9f8-abcde',
  node: 'worker-1',
  dropLocation: 'nf_hook_slow+0x8c',
  counters: { packetsOriginal: 2 ** 33, bytesOriginal: 2 ** 45, packetsReply: 5, bytesReply: 370, drops: 1, final: true, reason: 'closed', countedOnly: true, synsResent: 3 },
};

describe('EventWriter', () => {
  it('rawRange and copyTail copy exactly, at every length and offset, with and without views, across growth', () => {
    const src = new Uint8Array(700).map((_, i) => (i * 7 + 3) & 255);
    const srcView = new DataView(src.buffer);
    for (const withView of [false, true]) {
      const w = new EventWriter(16); // grows while copying
      const want: number[] = [];
      for (let n = 0; n <= 260; n += n < 20 ? 1 : 7) {
        for (const at of [0, 1, 3, 5]) {
          w.uint32(n & 127);
          want.push(n & 127);
          w.rawRange(src, at, n, withView ? srcView : undefined);
          want.push(...src.subarray(at, at + n));
        }
      }
      assert.deepEqual([...w.finish()], want, `rawRange, ${withView ? 'with' : 'without'} a view`);
      const target = new Uint8Array(300);
      const targetView = new DataView(target.buffer);
      for (const n of [0, 1, 5, 8, 33, 127, 128, 200]) {
        for (const start of [0, 1, 2]) {
          w.reset();
          w.rawRange(src, 11, start + n);
          target.fill(0);
          w.copyTail(start, target, 7, withView ? targetView : undefined);
          assert.deepEqual([...target.subarray(7, 7 + n)], [...src.subarray(11 + start, 11 + start + n)], `copyTail ${n} from ${start}`);
          assert.equal(target[6], 0);
          assert.equal(target[7 + n], 0, 'nothing past the end');
        }
      }
    }
  });

  it('the test event sets every field of Event and of the messages it holds', () => {
    const fieldsOf = (proto: object) => Object.keys(proto).filter((k) => k !== 'toJSON');
    const check = (what: string, proto: object, value: object | null | undefined) => {
      for (const f of fieldsOf(proto)) assert.ok(value && (value as Record<string, unknown>)[f] !== undefined, `${what}.${f} is not set in the test event`);
    };
    check('Event', pb.Event.prototype, everything);
    check('Conntrack', pb.Conntrack.prototype, everything.conntrack);
    check('Device', pb.Device.prototype, everything.device);
    check('Tuple', pb.Tuple.prototype, everything.packet);
    check('FlowCounters', pb.FlowCounters.prototype, everything.counters);
  });

  it('encodes events byte for byte as protobufjs does', () => {
    const events: pb.IEvent[] = [
      everything,
      { ...everything, summary: '', packetData: new Uint8Array(0), flowId: 0, priority: 99 },
      { kind: pb.EventKind.EVENT_KIND_CT_DESTROY, flowId: 3, conntrack: { id: 'ffff8888aa' } },
      {},
      ...Array.from({ length: 50 }, (_, i) => makeEvent(i * 7919)),
    ];
    const encoded = encodeEvents(events);
    events.forEach((_, i) => assert.deepEqual(Buffer.from(eventBytes(encoded, i)), Buffer.from(reference(events[i]!)), `event ${i}`));
    assert.equal(encoded.ends.at(-1), encoded.bytes.byteLength, 'the batch is its events, nothing else');
    assert.deepEqual(pb.Event.decode(eventBytes(encoded, 0).subarray(3)).toJSON(), pb.Event.fromObject(everything).toJSON());
  });

  it('encodes each field alone, and nothing for defaults, as the generated encoder does (src/stream/event-encoder)', () => {
    const nested = new Set(['packet', 'conntrack', 'device', 'counters']);
    for (const [field, value] of Object.entries(everything)) {
      const alone: pb.IEvent = { [field]: value };
      const encoded = encodeEvents([alone]);
      assert.deepEqual(Buffer.from(eventBytes(encoded, 0)), Buffer.from(reference(alone)), `Event.${field} alone`);
      if (!nested.has(field)) continue;
      for (const [inner, v] of Object.entries(value as object)) {
        const one: pb.IEvent = { [field]: { [inner]: v } };
        assert.deepEqual(Buffer.from(eventBytes(encodeEvents([one]), 0)), Buffer.from(reference(one)), `Event.${field}.${inner} alone`);
      }
    }
    const defaults: pb.IEvent = { tsNs: Long.UZERO, kind: 0, flowId: 0, service: '', priority: 0, afterNat: false, rulePath: [], packetData: new Uint8Array(0), packet: { src: '', srcPort: 0 }, conntrack: { statusNames: [] } };
    assert.deepEqual(Buffer.from(eventBytes(encodeEvents([defaults]), 0)), Buffer.from(reference(defaults)));
    // Fields of a newer schema kept by a decoder ($unknowns, field 1007 here) are written back as they came.
    const unknown = Uint8Array.from([0xf8, 0x3e, 0x07]);
    for (const newer of [{ ...makeEvent(5), $unknowns: [unknown] }, { ...makeEvent(6), packet: { src: '10.0.0.1', $unknowns: [unknown] } }]) {
      const ours = Buffer.from(eventBytes(encodeEvents([newer]), 0));
      assert.deepEqual(ours, Buffer.from(reference(newer)), 'unknown fields kept');
      assert.ok(ours.includes(Buffer.from(unknown)));
    }
  });

  it('writes numbers as protobufjs does at every edge', () => {
    const ours = new EventWriter(8);
    const theirs = protobuf.Writer.create();
    for (const v of [0, 1, 127, 128, 16383, 16384, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1]) {
      ours.uint32(v);
      theirs.uint32(v);
    }
    for (const v of [0, 1, -1, -128, 2 ** 31 - 1, -(2 ** 31)]) {
      ours.int32(v).sint32(v);
      theirs.int32(v).sint32(v);
    }
    for (const v of [0, 2 ** 32, 2 ** 53 - 1, -1, -(2 ** 40)]) {
      ours.uint64(v);
      theirs.uint64(v);
    }
    ours.uint64(Long.MAX_UNSIGNED_VALUE).bool(true).bool(false).double(-0.5).bytes('AQID');
    theirs.uint64(Long.MAX_UNSIGNED_VALUE).bool(true).bool(false).double(-0.5).bytes('AQID');
    assert.deepEqual(Buffer.from(ours.finish()), Buffer.from(theirs.finish()));
  });

  it('nests sub-messages of any length, growing its buffer as it goes', () => {
    const ours = new EventWriter(4);
    const theirs = protobuf.Writer.create();
    for (const n of [0, 127, 128, 20000]) {
      const text = 'x'.repeat(n);
      ours.uint32(10).fork().uint32(18).fork().string(text).ldelim().ldelim();
      theirs.uint32(10).fork().uint32(18).fork().string(text).ldelim().ldelim();
    }
    assert.deepEqual(Buffer.from(ours.finish()), Buffer.from(theirs.finish()));
    // Whatever it kept for a length, the length comes out minimal, as protobufjs writes it.
    for (const kept of [1, 2, 3]) {
      const w = new EventWriter(4);
      const ref = protobuf.Writer.create();
      for (const n of [0, 1, 126, 127, 128, 129, 16383, 16384, 70000]) {
        w.uint32(10).fork(kept).string('y'.repeat(n)).ldelim();
        ref.uint32(10).fork().string('y'.repeat(n)).ldelim();
      }
      assert.deepEqual(Buffer.from(w.finish()), Buffer.from(ref.finish()), `${kept} byte(s) kept`);
    }
    assert.throws(() => new EventWriter().ldelim(), /without fork/);
  });
});
