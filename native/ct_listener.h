// Listens to conntrack DESTROY events (ctnetlink, NFNLGRP_CONNTRACK_DESTROY)
// in one network namespace and turns those of traced services into
// svt_event records of kind SVT_EV_CT_DESTROY, delivered like ring-buffer
// batches. This is how svctrace sees a flow end without kprobes or fentry.
// It also forgets the flow's wire tuples in the BPF svt_flows map, and takes
// the flow's in-kernel counters out of svt_flow_state: they are the flow's
// final account, delivered as a svt_flow_stats record (SVT_STATS_CLOSED)
// just before the destroy event.
#pragma once

#include <linux/types.h>

#include <memory>
#include <string>

#include "netlink_listener.h"
#include "service_set.h"

struct svt_tuple;

namespace svt {

class CtListener : public NetlinkListener {
 public:
  // `active_flows` is the BPF program's svt_active_flows (memory-mapped .bss).
  CtListener(Napi::Env env, const std::string& netns_path, unsigned long netns_ino,
             std::shared_ptr<const ServiceSet> services, int flows_map_fd, int state_map_fd,
             int stale_destroys_fd, volatile unsigned long long* active_flows);

 protected:
  void Handle(const nlmsghdr* nlh) override;

 private:
  bool ConsumeStaleDestroy(const svt_tuple& orig);
  void ForgetActiveFlow();
  unsigned long netns_ino_;
  std::shared_ptr<const ServiceSet> services_;
  int flows_map_fd_;
  int state_map_fd_;
  int stale_destroys_fd_;
  volatile unsigned long long* active_flows_;
};

}  // namespace svt
