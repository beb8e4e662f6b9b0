// Listens to conntrack DESTROY events (ctnetlink, NFNLGRP_CONNTRACK_DESTROY)
// in one network namespace and turns those of traced services into
// svt_event records of kind SVT_EV_CT_DESTROY, delivered like ring-buffer
// batches. This is how svctrace sees a flow end without kprobes or fentry.
// It also forgets the flow's wire tuples in the BPF svt_flows map, and takes
// the flow's in-kernel counters out of svt_flow_state: they are the flow's
// final account, delivered as a svt_flow_stats record (SVT_STATS_CLOSED)
// just before the destroy event. A counted-only connection whose end the
// kernel reported (SVT_STATS_ENDED) with no packet since gets neither.
// Where conntrack accounting is on, the destroy carries conntrack's own
// counters: a direction where they exceed the kernel's (packets our hooks
// never saw: see RaiseToConntrack) is corrected and counted.
#pragma once

#include <linux/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "events.h"
#include "netlink_listener.h"
#include "service_set.h"

struct nlattr;
struct svt_flow_counters;
struct svt_tuple;

namespace svt {

class CtListener : public NetlinkListener {
 public:
  // `active_flows` and `stale_owed` are the BPF program's svt_active_flows
  // and svt_stale_owed (memory-mapped .bss); the two program fds are
  // svt_destroy_find and svt_destroy_forget, or -1 (kernels before 5.14).
  CtListener(Napi::Env env, const std::string& netns_path, unsigned long netns_ino,
             std::shared_ptr<const ServiceSet> services, int flows_map_fd, int state_map_fd,
             int stale_destroys_fd, volatile unsigned long long* active_flows,
             volatile unsigned long long* stale_owed, int find_prog_fd, int forget_prog_fd);

 // Packets conntrack counted in a destroyed entry that our hooks did not
  // (see RaiseToConntrack): the final counters were corrected by as many.
  uint64_t packets_missed() const { return packets_missed_.load(std::memory_order_relaxed); }

  // Has the kernel queue only the destroys of `keys`' entries to this
  // listener (see ct_filter.h); Handle still checks each against the
  // service set. False when none could be attached (too many services, or
  // the kernel refused it): then every destroy is read, as without one.
  bool FilterServices(const std::vector<svt_service_key>& keys);

  // Counters lost in race 2 (see Handle): a new entry's state taken by an
  // old entry's destroy could not be put back, because the new entry's next
  // packet had already made a state of its own. Counted with the kernel's
  // flow_state losses.
  uint64_t states_lost_in_race() const { return states_lost_in_race_.load(std::memory_order_relaxed); }

  // False once the kernel refused to run a destroy program: destroys are
  // then handled with map syscalls (as where the programs were not loaded).
  bool destroy_programs_ran() const { return !programs_refused_.load(std::memory_order_relaxed); }

 protected:
  void Handle(const nlmsghdr* nlh) override;

 private:
  bool ConsumeStaleDestroy(const svt_tuple& orig);
  bool DeleteFlowRefs(const svt_tuple* keys, unsigned n);
  unsigned FindFlow(const svt_tuple& orig, __u64* ct_id, __u64* first_ns);
  bool RunDestroyProgram(int prog_fd, svt_destroy_ctx* c);
  unsigned ForgetFlow(const svt_tuple (&keys)[4], bool taken, __u64 ct_id);
  bool RaiseToConntrack(const nlattr* const* top, svt_flow_counters* c);
  unsigned long netns_ino_;
  std::shared_ptr<const ServiceSet> services_;
  int flows_map_fd_;
  int state_map_fd_;
  int stale_destroys_fd_;
  volatile unsigned long long* active_flows_;
  volatile unsigned long long* stale_owed_;
  int find_prog_fd_;
  int forget_prog_fd_;
  std::atomic<bool> programs_refused_{false};
  std::atomic<uint64_t> packets_missed_{0};
  std::atomic<uint64_t> states_lost_in_race_{0};
  bool batch_delete_ = true;  // the kernel takes BPF_MAP_DELETE_BATCH (Linux >= 5.6)
};

}  // namespace svt
