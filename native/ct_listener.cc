#include "ct_listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>  // before the linux/ headers: libc-compat then skips duplicates
#include <linux/types.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <bpf/bpf.h>
#include <errno.h>
#include <libmnl/libmnl.h>
#include <poll.h>
#include <string.h>
#include <time.h>

#include "errors.h"
#include "events.h"
#include "netns.h"

namespace svt {

namespace {

constexpr int kPollMs = 50;

uint64_t MonotonicNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // the clock bpf_ktime_get_ns() reads
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// Collects the attributes of one nesting level by type.
template <int N>
struct Attrs {
  const nlattr* a[N + 1] = {};
};

template <int N>
int CollectAttr(const nlattr* attr, void* data) {
  auto* out = static_cast<Attrs<N>*>(data);
  int type = mnl_attr_get_type(attr);
  if (type >= 0 && type <= N) out->a[type] = attr;
  return MNL_CB_OK;
}

template <int N>
Attrs<N> Nested(const nlattr* nest) {
  Attrs<N> out;
  if (nest) mnl_attr_parse_nested(nest, CollectAttr<N>, &out);
  return out;
}

// CTA_TUPLE_* -> svt_tuple (network byte order kept).
bool ParseTuple(const nlattr* nest, svt_tuple* t) {
  if (!nest) return false;
  auto tuple = Nested<CTA_TUPLE_MAX>(nest);
  auto ip = Nested<CTA_IP_MAX>(tuple.a[CTA_TUPLE_IP]);
  auto proto = Nested<CTA_PROTO_MAX>(tuple.a[CTA_TUPLE_PROTO]);
  if (!ip.a[CTA_IP_V4_SRC] || !ip.a[CTA_IP_V4_DST] || !proto.a[CTA_PROTO_NUM]) return false;
  t->saddr = mnl_attr_get_u32(ip.a[CTA_IP_V4_SRC]);
  t->daddr = mnl_attr_get_u32(ip.a[CTA_IP_V4_DST]);
  t->proto = mnl_attr_get_u8(proto.a[CTA_PROTO_NUM]);
  if (proto.a[CTA_PROTO_SRC_PORT]) t->sport = mnl_attr_get_u16(proto.a[CTA_PROTO_SRC_PORT]);
  if (proto.a[CTA_PROTO_DST_PORT]) t->dport = mnl_attr_get_u16(proto.a[CTA_PROTO_DST_PORT]);
  return true;
}

void ReverseInto(svt_tuple* out, const svt_tuple& in) {
  *out = svt_tuple{};
  out->saddr = in.daddr;
  out->daddr = in.saddr;
  out->sport = in.dport;
  out->dport = in.sport;
  out->proto = in.proto;
}

}  // namespace

CtListener::CtListener(Napi::Env env, const std::string& netns_path, unsigned long netns_ino,
                       std::shared_ptr<const ServiceSet> services, int flows_map_fd, volatile unsigned long long* active_flows)
    : netns_ino_(netns_ino), services_(std::move(services)), flows_map_fd_(flows_map_fd), active_flows_(active_flows) {
  // A netlink socket belongs to the namespace it is created in: create it
  // there, then read it from any thread.
  NetnsResult r = RunInNetns(netns_path, [&](NetnsResult& res) {
    nl_ = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
    if (!nl_) {
      res.op = "mnl_socket_open(NETLINK_NETFILTER)";
      return -errno;
    }
    if (mnl_socket_bind(nl_, 1u << (NFNLGRP_CONNTRACK_DESTROY - 1), MNL_SOCKET_AUTOPID) < 0) {
      res.op = "bind NFNLGRP_CONNTRACK_DESTROY";
      return -errno;
    }
    // Bursts of closing flows must not overflow the socket: ask for 4 MiB.
    int rcvbuf = 4 * 1024 * 1024;
    setsockopt(mnl_socket_get_fd(nl_), SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
    return 0;
  });
  if (r.err != 0) {
    if (nl_) mnl_socket_close(nl_);
    nl_ = nullptr;
    ThrowErrno(env, r.op, r.err, r.detail.empty() ? netns_path : r.detail);
  }
}

CtListener::~CtListener() {
  Stop();
  if (nl_) mnl_socket_close(nl_);
}

void CtListener::Start(Napi::Env env, Napi::Function on_batch) {
  if (sink_) return;
  sink_ = std::make_unique<BatchSink>(env, on_batch, "svctrace-ct-listener");
  thread_ = std::thread([this] { Run(); });
}

void CtListener::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (sink_) sink_->Close();
}

void CtListener::Run() {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE * 4);
  int fd = mnl_socket_get_fd(nl_);
  while (!stop_.load()) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int pr = poll(&pfd, 1, sink_->pending() ? 2 : kPollMs);
    if (pr > 0) {
      // Drain everything queued, then flush once.
      for (;;) {
        ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n < 0) {
          if (errno == ENOBUFS) {
            overruns_++;
            continue;
          }
          break;
        }
        Handle(buf.data(), (size_t)n);
      }
    }
    if (sink_->Due()) sink_->Flush();
  }
}

void CtListener::Handle(const void* data, size_t size) {
  const nlmsghdr* nlh = static_cast<const nlmsghdr*>(data);
  int len = (int)size;
  for (; mnl_nlmsg_ok(nlh, len); nlh = mnl_nlmsg_next(nlh, &len)) {
    if (NFNL_SUBSYS_ID(nlh->nlmsg_type) != NFNL_SUBSYS_CTNETLINK) continue;
    if (NFNL_MSG_TYPE(nlh->nlmsg_type) != IPCTNL_MSG_CT_DELETE) continue;
    Attrs<CTA_MAX> top;
    mnl_attr_parse(nlh, sizeof(nfgenmsg), CollectAttr<CTA_MAX>, &top);
    svt_event e = {};
    if (!ParseTuple(top.a[CTA_TUPLE_ORIG], &e.ct_orig)) continue;
    if (!services_->Contains(e.ct_orig.daddr, e.ct_orig.dport, e.ct_orig.proto)) continue;
    ParseTuple(top.a[CTA_TUPLE_REPLY], &e.ct_reply);
    e.kind = SVT_EV_CT_DESTROY;
    e.size = sizeof(svt_event);
    e.ts_ns = MonotonicNs();
    e.netns_ino = (__u32)netns_ino_;
    e.pkt = e.ct_orig;
    if (top.a[CTA_STATUS]) e.ct_status = ntohl(mnl_attr_get_u32(top.a[CTA_STATUS]));
    if (top.a[CTA_MARK]) e.ct_mark = ntohl(mnl_attr_get_u32(top.a[CTA_MARK]));
    if (top.a[CTA_ZONE]) e.ct_zone = ntohs(mnl_attr_get_u16(top.a[CTA_ZONE]));
    // The netlink id is not the kernel address the BPF side reports; user
    // space correlates the destroy by tuple and namespace instead.
    if (top.a[CTA_ID]) e.reason = ntohl(mnl_attr_get_u32(top.a[CTA_ID]));
    if (top.a[CTA_PROTOINFO]) {
      auto pi = Nested<CTA_PROTOINFO_MAX>(top.a[CTA_PROTOINFO]);
      auto tcp = Nested<CTA_PROTOINFO_TCP_MAX>(pi.a[CTA_PROTOINFO_TCP]);
      if (tcp.a[CTA_PROTOINFO_TCP_STATE]) e.ct_tcp_state = mnl_attr_get_u8(tcp.a[CTA_PROTOINFO_TCP_STATE]);
    }
    sink_->Append(&e, sizeof(e));
    events_++;
    // The flow is gone: forget its wire tuples in the kernel, and count it
    // out of the active flows (never below zero) if it was registered.
    svt_tuple t;
    if (bpf_map_delete_elem(flows_map_fd_, &e.ct_orig) == 0 && active_flows_) {
      unsigned long long cur = __atomic_load_n(active_flows_, __ATOMIC_RELAXED);
      while (cur > 0 && !__atomic_compare_exchange_n(active_flows_, &cur, cur - 1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      }
    }
    bpf_map_delete_elem(flows_map_fd_, &e.ct_reply);
    ReverseInto(&t, e.ct_orig);
    bpf_map_delete_elem(flows_map_fd_, &t);
    ReverseInto(&t, e.ct_reply);
    bpf_map_delete_elem(flows_map_fd_, &t);
  }
}

}  // namespace svt
