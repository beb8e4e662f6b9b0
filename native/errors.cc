#include "errors.h"

#include <unistd.h>

#include <vector>

#include <bpf/libbpf.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <deque>
#include <mutex>

namespace svt {

namespace {

std::mutex g_log_mutex;
std::deque<std::string> g_log;  // most recent libbpf lines, bounded
constexpr size_t kMaxLogLines = 400;
bool g_verbose = false;

int LibbpfPrint(enum libbpf_print_level level, const char* fmt, va_list args) {
  // One call can be a whole verifier log (its end says why it failed): sized
  // to fit, then kept as lines.
  char stack_buf[1024];
  va_list copy;
  va_copy(copy, args);
  int n = vsnprintf(stack_buf, sizeof(stack_buf), fmt, copy);
  va_end(copy);
  if (n < 0) return 0;
  std::string text;
  if ((size_t)n < sizeof(stack_buf)) {
    text.assign(stack_buf, (size_t)n);
  } else {
    text.resize((size_t)n + 1);
    va_copy(copy, args);
    vsnprintf(text.data(), text.size(), fmt, copy);
    va_end(copy);
    text.resize((size_t)n);
  }
  if (g_verbose) fputs(text.c_str(), stderr);
  if (level == LIBBPF_DEBUG && !g_verbose) return n;
  std::lock_guard<std::mutex> lock(g_log_mutex);
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    end = end == std::string::npos ? text.size() : end + 1;
    g_log.emplace_back(text.substr(start, end - start));
    start = end;
  }
  while (g_log.size() > kMaxLogLines) g_log.pop_front();
  return n;
}

// The capabilities svctrace needs that this process lacks, read from
// /proc/self/status (CapEff) so that a root process with some dropped is
// told which. Netfilter links, netlink groups and nftables need
// CAP_NET_ADMIN; entering another namespace (setns) CAP_SYS_ADMIN; loading
// and tracing CAP_BPF + CAP_PERFMON, or CAP_SYS_ADMIN, which covers both.
std::vector<std::string> MissingCapabilities(const std::string& op) {
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) return {};
  char line[256];
  unsigned long long eff = 0;
  while (fgets(line, sizeof(line), f)) {
    if (sscanf(line, "CapEff: %llx", &eff) == 1) break;
  }
  fclose(f);
  auto has = [&](int bit) { return (eff >> bit) & 1ULL; };
  const int kNetAdmin = 12, kSysAdmin = 21, kPerfmon = 38, kBpf = 39;
  std::vector<std::string> missing;
  if (!has(kNetAdmin)) missing.push_back("CAP_NET_ADMIN");
  if (!has(kSysAdmin)) {
    if (op == "setns") missing.push_back("CAP_SYS_ADMIN");
    if (!has(kBpf)) missing.push_back("CAP_BPF");
    if (!has(kPerfmon)) missing.push_back("CAP_PERFMON");
  }
  return missing;
}

}  // namespace

std::string ErrnoName(int err) {
  if (err < 0) err = -err;
  const char* name = strerrorname_np(err);
  if (name) return name;
  return "E" + std::to_string(err);
}

std::string DescribeFailure(const std::string& op, int err, const std::string& detail) {
  if (err < 0) err = -err;
  std::string what = detail.empty() ? op : op + " (" + detail + ")";
  std::string sentence = what + " failed: " + strerror(err);
  if (err == EPERM || err == EACCES) {
    const std::vector<std::string> missing = MissingCapabilities(op);
    std::string names;
    for (const std::string& m : missing) names += (names.empty() ? "" : "+") + m;
    if (missing.empty()) {
      sentence = "refused by the kernel although svctrace holds the capabilities it needs (" + what + ": " +
                 strerror(err) + "): the feature is disabled or locked down on this kernel";
    } else if (geteuid() == 0) {
      sentence = "not permitted: this root process lacks " + names + " (dropped from its capability set?) (" + what +
                 ": " + strerror(err) + ")";
    } else {
      sentence = "not permitted: run as root or with CAP_BPF+CAP_NET_ADMIN+CAP_PERFMON (" + what + ": " +
                 strerror(err) + ")";
    }
  } else if (op == "bpf_program__attach_netfilter" && (err == EINVAL || err == EOPNOTSUPP)) {
    sentence = "netfilter BPF links need Linux >= 6.4 with CONFIG_NETFILTER_BPF_LINK=y (" + what +
               ": " + strerror(err) + ")";
  } else if (op == "open netns" && err == ENOENT) {
    sentence = "network namespace not found: " + detail;
  } else if (op == "bpf_object__load" && err == E2BIG) {
    sentence = "the kernel rejected svctrace's BPF programs as too large (" + what + ")";
  }
  return sentence;
}

void ThrowErrno(Napi::Env env, const std::string& op, int err, const std::string& detail) {
  if (err < 0) err = -err;
  if (err == 0) err = EINVAL;
  Napi::Error e = Napi::Error::New(env, DescribeFailure(op, err, detail));
  e.Set("code", ErrnoName(err));
  e.Set("errno", Napi::Number::New(env, err));
  e.Set("op", op);
  if (op == "bpf_object__load") e.Set("log", LibbpfLogTail(60));
  throw e;
}

void InstallLibbpfLogger() {
  const char* v = getenv("SVCTRACE_VERBOSE");
  g_verbose = v && *v && strcmp(v, "0") != 0;
  libbpf_set_print(LibbpfPrint);
}

std::string LibbpfLogTail(size_t max_lines) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::string out;
  size_t start = g_log.size() > max_lines ? g_log.size() - max_lines : 0;
  for (size_t i = start; i < g_log.size(); i++) out += g_log[i];
  return out;
}

void ClearLibbpfLog() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log.clear();
}

}  // namespace svt
