// Reads nftables trace messages (NFT_MSG_TRACE on NFNLGRP_NFTRACE) in one
// network namespace: for packets svctrace marked with `meta nftrace set 1`,
// the kernel reports every rule and chain they met — the observed path
// through kube-proxy's chains. Each message becomes a struct svt_nftrace.
#pragma once

#include <linux/types.h>

#include <string>
#include <unordered_map>

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
  // Only a trace's first message carries the packet headers: remember the
  // tuple by trace id for the messages that follow (bounded).
  std::unordered_map<__u32, svt_tuple> tuples_;
};

}  // namespace svt
