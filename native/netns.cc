#include "netns.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <thread>

namespace svt {

namespace {

NetnsResult RunOnThread(const std::function<int(NetnsResult&)>& enter,
                        const std::function<int(NetnsResult&)>& work) {
  NetnsResult result;
  std::thread t([&] {
    if (enter(result) != 0) return;
    result.err = work(result);
  });
  t.join();
  return result;
}

}  // namespace

NetnsResult RunInNetns(const std::string& netns_path,
                       const std::function<int(NetnsResult&)>& work) {
  int fd = open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    NetnsResult r;
    r.err = -errno;
    r.op = "open netns";
    r.detail = netns_path;
    return r;
  }
  NetnsResult r = RunOnThread(
      [&](NetnsResult& res) {
        if (setns(fd, CLONE_NEWNET) != 0) {
          res.err = -errno;
          res.op = "setns";
          res.detail = netns_path;
          return -1;
        }
        return 0;
      },
      work);
  close(fd);
  return r;
}

NetnsResult RunInFreshNetns(const std::function<int(NetnsResult&)>& work) {
  return RunOnThread(
      [](NetnsResult& res) {
        // unshare(CLONE_NEWNET) affects only this thread's task.
        if (unshare(CLONE_NEWNET) != 0) {
          res.err = -errno;
          res.op = "unshare(CLONE_NEWNET)";
          return -1;
        }
        return 0;
      },
      work);
}

unsigned long NetnsInode(const std::string& netns_path) {
  struct stat st;
  if (stat(netns_path.c_str(), &st) != 0) return 0;
  return (unsigned long)st.st_ino;
}

}  // namespace svt
