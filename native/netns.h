// Running a piece of work inside another network namespace. Netfilter links
// bind to the netns of the task that creates them, so the attach happens on a
// short-lived helper thread that setns()es first: the caller's (Node's main)
// thread never changes namespace, whatever fails.
#pragma once

#include <functional>
#include <string>

namespace svt {

// Result of work run in a namespace: 0 or a negative errno, plus which step.
struct NetnsResult {
  int err = 0;
  std::string op;
  std::string detail;
};

// Opens `netns_path` (e.g. /run/netns/NAME or /proc/PID/ns/net) and runs
// `work` on a helper thread inside it. `work` returns 0 or -errno and may set
// op/detail. Waits for the thread.
NetnsResult RunInNetns(const std::string& netns_path,
                       const std::function<int(NetnsResult&)>& work);

// Runs `work` on a helper thread inside a new, empty network namespace
// (unshare), which disappears when the thread ends. Used by feature probes so
// they never touch a real namespace.
NetnsResult RunInFreshNetns(const std::function<int(NetnsResult&)>& work);

// Inode number of a network namespace path (what the BPF programs report as
// netns_ino), or 0 when it cannot be read.
unsigned long NetnsInode(const std::string& netns_path);

}  // namespace svt
