// The Tracer: one libbpf skeleton of bpf/svctrace.bpf.c, its netfilter links
// (per network namespace) and its ring-buffer reader. JS lifecycle:
//   new Tracer() -> load() -> setServices() -> attachNetfilter(netns) ->
//   start(onBatch) -> stats() -> close()
#pragma once

#include <napi.h>

#include <memory>
#include <string>
#include <vector>

#include "ct_listener.h"
#include "drop_reasons.h"
#include "nftrace_listener.h"
#include "ring_reader.h"
#include "service_set.h"

struct svctrace_bpf;
struct bpf_link;

namespace svt {

class Tracer : public Napi::ObjectWrap<Tracer> {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit Tracer(const Napi::CallbackInfo& info);
  ~Tracer() override;

 private:
  Napi::Value Load(const Napi::CallbackInfo& info);
  Napi::Value SetServices(const Napi::CallbackInfo& info);
  Napi::Value AttachNetfilter(const Napi::CallbackInfo& info);
  Napi::Value Start(const Napi::CallbackInfo& info);
  Napi::Value Stats(const Napi::CallbackInfo& info);
  Napi::Value DeliveryIdle(const Napi::CallbackInfo& info);
  Napi::Value FlushListeners(const Napi::CallbackInfo& info);
  Napi::Value ListenersFlushed(const Napi::CallbackInfo& info);
  Napi::Object StatsObject(Napi::Env env);
  Napi::Value Close(const Napi::CallbackInfo& info);
  Napi::Value BenchEmit(const Napi::CallbackInfo& info);
  Napi::Value TraceRules(const Napi::CallbackInfo& info);
  Napi::Value ExpireFlowState(const Napi::CallbackInfo& info);
  Napi::Value SnapshotFlowState(const Napi::CallbackInfo& info);
  Napi::Value DropReasons(const Napi::CallbackInfo& info);
  Napi::Value Programs(const Napi::CallbackInfo& info);
  Napi::Value CollectFlowState(Napi::Env env, bool expire, uint64_t idle_ns);

  void RequireLoaded(Napi::Env env, const char* method);
  void Destroy();
  static void CleanupHook(void* arg);

  napi_env env_;
  svctrace_bpf* skel_ = nullptr;
  bool loaded_ = false;
  uint64_t ring_bytes_ = 0;
  bool closed_ = false;
  std::vector<bpf_link*> links_;
  // Distance of this instance's netfilter programs from NAT (0: not attached yet).
  int prio_gap_ = 0;
  // How the NAT-stage observers are attached: kBackendNetfilter (links per
  // namespace), kBackendFentry (global entry/exit trampolines on NAT's hook
  // functions) or kBackendKprobe (kprobe/kretprobe on the same functions);
  // the global ones filter by namespace in the kernel (svt_netns_inos).
  enum Backend { kBackendNetfilter, kBackendFentry, kBackendKprobe } backend_ = kBackendNetfilter;
  bool destroy_programs_ = false;  // svt_destroy_find/forget loaded (Linux 5.14+)
  int global_links_ = 0;  // the fentry/kprobe backend's attachments (all namespaces)
  size_t netns_count_ = 0;
  DropReasonInfo drop_reasons_;
  std::unique_ptr<RingReader> reader_;
  std::shared_ptr<ServiceSet> services_ = std::make_shared<ServiceSet>();
  std::vector<std::unique_ptr<CtListener>> ct_listeners_;
  std::vector<std::unique_ptr<NftTraceListener>> nft_listeners_;
  Napi::FunctionReference on_batch_;
  // The last generation asked of the listeners by flushListeners().
  uint64_t listener_flush_gen_ = 0;
};

}  // namespace svt
