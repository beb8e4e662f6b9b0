// Reads nftables trace messages (NFT_MSG_TRACE on NFNLGRP_NFTRACE) in one
// network namespace: for packets svctrace marked with `meta nftrace set 1`,
// the kernel reports every rule and chain they met — the observed path
// through kube-proxy's chains. Each message becomes a struct svt_nftrace.
#pragma once

#include <linux/types.h>

#include <string>
#include <array>

#include "events.h"
#include "netlink_listener.h"

namespace svt {

class NftTraceListener : public NetlinkListener {
 public:
  NftTraceListener(Napi::Env env, const std::string& netns_path, unsigned long netns_ino);

 protected:
  void Handle(const nlmsghdr* nlh) override;

 private:
  unsigned long netns_ino_;
  // Only a trace's first message carries the packet headers: the tuple is
  // remembered by trace id for the messages that follow, in a table of
  // fixed size with one slot per id hash (the kernel's trace ids are
  // hashes): a new trace takes the slot of an old one only when their ids
  // share it. (A map emptied whenever it was full took the tuple of every
  // trace in progress with it, and their later messages, a REJECT in the
  // filter table after the nat table's chains, came with none.)
  struct RememberedTuple {
    __u32 trace_id = 0;
    bool used = false;
    svt_tuple pkt = {};
  };
  static constexpr size_t kTupleSlots = 4096;  // a power of two
  std::array<RememberedTuple, kTupleSlots> tuples_{};
};

}  // namespace svt
