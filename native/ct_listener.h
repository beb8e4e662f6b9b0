// Listens to conntrack DESTROY events (ctnetlink, NFNLGRP_CONNTRACK_DESTROY)
// in one network namespace and turns those of traced services into
// svt_event records of kind SVT_EV_CT_DESTROY, delivered like ring-buffer
// batches. This is how svctrace sees a flow end without kprobes or fentry.
// It also forgets the flow's wire tuples in the BPF svt_flows map.
#pragma once

#include <napi.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "batch_sink.h"
#include "service_set.h"

struct mnl_socket;

namespace svt {

class CtListener {
 public:
  // Opens the netlink socket inside `netns_path`; throws a JS error on failure.
  // `active_flows` is the BPF program's svt_active_flows (memory-mapped .bss).
  CtListener(Napi::Env env, const std::string& netns_path, unsigned long netns_ino,
             std::shared_ptr<const ServiceSet> services, int flows_map_fd, volatile unsigned long long* active_flows);
  ~CtListener();

  void Start(Napi::Env env, Napi::Function on_batch);
  void Stop();

  uint64_t events() const { return events_.load(); }
  // Messages the kernel could not queue to us (ENOBUFS): destroys we missed.
  uint64_t overruns() const { return overruns_.load(); }

 private:
  void Run();
  void Handle(const void* buf, size_t len);

  mnl_socket* nl_ = nullptr;
  unsigned long netns_ino_;
  std::shared_ptr<const ServiceSet> services_;
  int flows_map_fd_;
  volatile unsigned long long* active_flows_;
  std::unique_ptr<BatchSink> sink_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> events_{0};
  std::atomic<uint64_t> overruns_{0};
};

}  // namespace svt
