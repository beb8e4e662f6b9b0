#include "ct_filter.h"

#include <arpa/inet.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netlink.h>

namespace svt {

namespace {

constexpr __u32 kKeep = 0xffffffff;  // the whole message
constexpr __u32 kDrop = 0;

// Scratch words (M[]) the program keeps what it found in.
enum Scratch : __u32 { kOrigNest, kProtoNest, kIpNest, kProto, kDstPort, kDstAddr };

// The kernel's netlink attribute search, as classic BPF ancillary loads:
// A = offset of the first attribute of type X at or after offset A (in the
// message: NLATTR) or inside the nest at offset A (NLATTR_NEST); 0 when
// there is none.
sock_filter FindAttr() { return BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (__u32)(SKF_AD_OFF + SKF_AD_NLATTR)); }
sock_filter FindNested() { return BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (__u32)(SKF_AD_OFF + SKF_AD_NLATTR_NEST)); }

// A == 0 (no such attribute): return `verdict`; else go on.
void ReturnIfNone(std::vector<sock_filter>& p, __u32 verdict) {
  p.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1));
  p.push_back(BPF_STMT(BPF_RET | BPF_K, verdict));
}

// A = the attribute of `type` inside the nest whose offset is in M[nest]; a
// message without it is dropped (user space would not take it either:
// ParseTuple needs it, or Contains fails on a port of 0).
void FindInNest(std::vector<sock_filter>& p, Scratch nest, __u32 type) {
  p.push_back(BPF_STMT(BPF_LD | BPF_MEM, nest));
  p.push_back(BPF_STMT(BPF_LDX | BPF_IMM, type));
  p.push_back(FindNested());
  ReturnIfNone(p, kDrop);
}

}  // namespace

std::vector<sock_filter> CtDestroyFilter(const std::vector<svt_service_key>& keys) {
  std::vector<sock_filter> p;
  if (keys.size() > kCtFilterMaxServices) return p;
  // The original tuple, among the top-level attributes after the headers.
  p.push_back(BPF_STMT(BPF_LD | BPF_IMM, NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nfgenmsg))));
  p.push_back(BPF_STMT(BPF_LDX | BPF_IMM, CTA_TUPLE_ORIG));
  p.push_back(FindAttr());
  ReturnIfNone(p, kKeep);
  p.push_back(BPF_STMT(BPF_ST, kOrigNest));

  p.push_back(BPF_STMT(BPF_LDX | BPF_IMM, CTA_TUPLE_PROTO));
  p.push_back(FindNested());
  ReturnIfNone(p, kDrop);
  p.push_back(BPF_STMT(BPF_ST, kProtoNest));
  // Loads at X + 4 read an attribute's value (after its 4-byte header), in
  // network order as classic BPF loads are: compared with ntoh* of the keys.
  FindInNest(p, kProtoNest, CTA_PROTO_NUM);
  p.push_back(BPF_STMT(BPF_MISC | BPF_TAX, 0));
  p.push_back(BPF_STMT(BPF_LD | BPF_B | BPF_IND, NLA_HDRLEN));
  p.push_back(BPF_STMT(BPF_ST, kProto));
  FindInNest(p, kProtoNest, CTA_PROTO_DST_PORT);
  p.push_back(BPF_STMT(BPF_MISC | BPF_TAX, 0));
  p.push_back(BPF_STMT(BPF_LD | BPF_H | BPF_IND, NLA_HDRLEN));
  p.push_back(BPF_STMT(BPF_ST, kDstPort));

  FindInNest(p, kOrigNest, CTA_TUPLE_IP);
  p.push_back(BPF_STMT(BPF_ST, kIpNest));
  FindInNest(p, kIpNest, CTA_IP_V4_DST);  // none in an IPv6 entry's: dropped
  p.push_back(BPF_STMT(BPF_MISC | BPF_TAX, 0));
  p.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_IND, NLA_HDRLEN));
  p.push_back(BPF_STMT(BPF_ST, kDstAddr));

  // One block per service, port first (what tells most services apart):
  // a mismatch jumps past the rest of its block to the next one.
  for (const svt_service_key& k : keys) {
    const bool any_addr = k.addr == 0;
    const __u8 rest = any_addr ? 3 : 5;  // instructions after the port's jump
    p.push_back(BPF_STMT(BPF_LD | BPF_MEM, kDstPort));
    p.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ntohs(k.port), 0, rest));
    p.push_back(BPF_STMT(BPF_LD | BPF_MEM, kProto));
    p.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, k.proto, 0, (__u8)(rest - 2)));
    if (!any_addr) {
      p.push_back(BPF_STMT(BPF_LD | BPF_MEM, kDstAddr));
      p.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ntohl(k.addr), 0, 1));
    }
    p.push_back(BPF_STMT(BPF_RET | BPF_K, kKeep));
  }
  p.push_back(BPF_STMT(BPF_RET | BPF_K, kDrop));
  return p;
}

}  // namespace svt
