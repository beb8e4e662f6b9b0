// The traced services as user space knows them (the same entries as the BPF
// svt_services map), for filtering events that do not come from BPF, such as
// conntrack netlink messages. Thread-safe: read by listener threads.
#pragma once

#include <linux/types.h>

#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "events.h"

namespace svt {

class ServiceSet {
 public:
  void Replace(const std::vector<svt_service_key>& keys) {
    std::lock_guard<std::mutex> lock(mu_);
    keys_.clear();
    for (const auto& k : keys) keys_.insert(std::make_tuple(k.addr, k.port, k.proto));
  }

  std::vector<svt_service_key> Keys() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<svt_service_key> out;
    for (const auto& [addr, port, proto] : keys_) out.push_back(svt_service_key{addr, port, proto, 0});
    return out;
  }

  // addr/port in network order; true when addr:port/proto or *:port/proto is traced.
  bool Contains(__u32 addr, __u16 port, __u8 proto) const {
    std::lock_guard<std::mutex> lock(mu_);
    return keys_.count(std::make_tuple(addr, port, proto)) || keys_.count(std::make_tuple(0u, port, proto));
  }

 private:
  mutable std::mutex mu_;
  std::set<std::tuple<__u32, __u16, __u8>> keys_;
};

}  // namespace svt
