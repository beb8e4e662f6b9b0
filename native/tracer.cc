#include "tracer.h"

#include <arpa/inet.h>
#include <netinet/in.h>  // before the linux/ headers: libc-compat then skips duplicates
#include <linux/types.h>
#include <linux/netfilter.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <errno.h>

#include <array>
#include <unistd.h>

#include "drop_reasons.h"
#include "errors.h"
#include "events.h"
#include "flow_refs.h"
#include "map_take.h"
#include "netns.h"
#include "signals_held.h"
#include "svctrace.skel.h"

namespace svt {

namespace {

// The kernel's own numbers for one loaded program (bpf_prog_info). runs and
// run_ns count only while kernel.bpf_stats_enabled is on (or a
// BPF_ENABLE_STATS descriptor is open). recursion_misses: runs the kernel
// skipped because the program (a trampoline's: fentry, tp_btf) or any
// program (a kprobe's, counted since 6.7) already ran on that CPU; 0 where
// the kernel does not count them.
struct ProgramInfo {
  const char* name;
  bpf_prog_info info;
};

std::vector<ProgramInfo> LoadedPrograms(bpf_object* obj) {
  std::vector<ProgramInfo> out;
  bpf_program* p;
  bpf_object__for_each_program(p, obj) {
    int fd = bpf_program__fd(p);
    if (fd < 0) continue;  // not loaded: another backend's, or the benchmark source
    ProgramInfo pi{bpf_program__name(p), {}};
    __u32 len = sizeof(pi.info);
    if (bpf_prog_get_info_by_fd(fd, &pi.info, &len) != 0) continue;
    out.push_back(pi);
  }
  return out;
}

struct NfAttachPoint {
  int hook;
  int nat_priority;  // the NAT hook's: ours sit just before or after it
  bool after_nat;
};

// Farthest distance from NAT's priority tried when others hold the nearer
// ones: -120..-101 and -99..-80 around DNAT (between mangle at -150 and
// filter at 0), 80..99 and 101..120 around SNAT (after security at 50).
constexpr int kMaxPrioGap = 20;

// Around DNAT on the paths a Service packet enters by (forwarded: PRE_ROUTING;
// from a local process such as curl on the node: LOCAL_OUT), and around SNAT
// on the paths it leaves or is delivered by.
const NfAttachPoint kNfAttachPoints[] = {
    {NF_INET_PRE_ROUTING, SVT_NF_PRIO_DNAT, false},
    {NF_INET_PRE_ROUTING, SVT_NF_PRIO_DNAT, true},
    {NF_INET_LOCAL_OUT, SVT_NF_PRIO_DNAT, false},
    {NF_INET_LOCAL_OUT, SVT_NF_PRIO_DNAT, true},
    {NF_INET_POST_ROUTING, SVT_NF_PRIO_SNAT, false},
    {NF_INET_POST_ROUTING, SVT_NF_PRIO_SNAT, true},
    {NF_INET_LOCAL_IN, SVT_NF_PRIO_SNAT, false},
    {NF_INET_LOCAL_IN, SVT_NF_PRIO_SNAT, true},
};

uint32_t GetU32(Napi::Object o, const char* key) {
  Napi::Value v = o.Get(key);
  if (!v.IsNumber()) throw Napi::TypeError::New(o.Env(), std::string("service.") + key + " must be a number");
  return v.As<Napi::Number>().Uint32Value();
}

}  // namespace

Napi::Function Tracer::Init(Napi::Env env) {
  return DefineClass(env, "Tracer",
                     {
                         InstanceMethod("load", &Tracer::Load),
                         InstanceMethod("setServices", &Tracer::SetServices),
                         InstanceMethod("attachNetfilter", &Tracer::AttachNetfilter),
                         InstanceMethod("start", &Tracer::Start),
                         InstanceMethod("stats", &Tracer::Stats),
                         InstanceMethod("deliveryIdle", &Tracer::DeliveryIdle),
                         InstanceMethod("flushListeners", &Tracer::FlushListeners),
                         InstanceMethod("listenersFlushed", &Tracer::ListenersFlushed),
                         InstanceMethod("close", &Tracer::Close),
                         InstanceMethod("benchEmit", &Tracer::BenchEmit),
                         InstanceMethod("traceRules", &Tracer::TraceRules),
                         InstanceMethod("expireFlowState", &Tracer::ExpireFlowState),
                         InstanceMethod("snapshotFlowState", &Tracer::SnapshotFlowState),
                         InstanceMethod("dropReasons", &Tracer::DropReasons),
                         InstanceMethod("programs", &Tracer::Programs),
                     });
}

// The fentry backend's programs, one entry/exit pair per NAT hook function.
static std::array<bpf_program*, 8> FentryPrograms(svctrace_bpf* s) {
  return {s->progs.svt_fentry_nf_nat_ipv4_pre_routing, s->progs.svt_fexit_nf_nat_ipv4_pre_routing,
          s->progs.svt_fentry_nf_nat_ipv4_local_fn,    s->progs.svt_fexit_nf_nat_ipv4_local_fn,
          s->progs.svt_fentry_nf_nat_ipv4_out,         s->progs.svt_fexit_nf_nat_ipv4_out,
          s->progs.svt_fentry_nf_nat_ipv4_local_in,    s->progs.svt_fexit_nf_nat_ipv4_local_in};
}

// The kprobe backend's: a kprobe and a kretprobe per NAT hook function.
static std::array<bpf_program*, 8> KprobePrograms(svctrace_bpf* s) {
  return {s->progs.svt_kprobe_nf_nat_ipv4_pre_routing, s->progs.svt_kretprobe_nf_nat_ipv4_pre_routing,
          s->progs.svt_kprobe_nf_nat_ipv4_local_fn,    s->progs.svt_kretprobe_nf_nat_ipv4_local_fn,
          s->progs.svt_kprobe_nf_nat_ipv4_out,         s->progs.svt_kretprobe_nf_nat_ipv4_out,
          s->progs.svt_kprobe_nf_nat_ipv4_local_in,    s->progs.svt_kretprobe_nf_nat_ipv4_local_in};
}

// new Tracer({ backend?, snaplen?, allPackets?, ringBufferBytes?, statsIntervalMs?, benchSource? }):
// backend = "netfilter" (default), "fentry" or "kprobe" (the choice is made in JS,
// from the kernel probes: src/tracer/backend.ts);
// snaplen = bytes of each packet to capture (0 = off); ringBufferBytes = size
// of the kernel ring buffer (a power of two, >= the page size);
// statsIntervalMs = interval of the periodic per-flow counter records;
// detailRate = new flows per second whose transitions are reported, the rest
// counted only (0, the default here: every flow; the CLI's default is
// DEFAULT_DETAIL_RATE in src/events/layout.ts).
Tracer::Tracer(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Tracer>(info), env_(info.Env()) {
  Napi::Env env = info.Env();
  Napi::Object opts = info.Length() > 0 && info[0].IsObject() ? info[0].As<Napi::Object>() : Napi::Object::New(env);
  auto number = [&](const char* key, double dflt) -> double {
    Napi::Value v = opts.Get(key);
    if (v.IsUndefined()) return dflt;
    if (!v.IsNumber()) throw Napi::TypeError::New(env, std::string(key) + " must be a number");
    return v.As<Napi::Number>().DoubleValue();
  };
  double snaplen = number("snaplen", 0);
  if (!(snaplen >= 0 && snaplen <= SVT_MAX_SNAPLEN) || snaplen != (uint32_t)snaplen)
    throw Napi::RangeError::New(env, "snaplen must be 0.." + std::to_string(SVT_MAX_SNAPLEN));
  double ring = number("ringBufferBytes", SVT_RINGBUF_BYTES);
  uint64_t ring_bytes = (uint64_t)ring;
  long page = sysconf(_SC_PAGESIZE);
  if (ring != (double)ring_bytes || ring_bytes < (uint64_t)page || (ring_bytes & (ring_bytes - 1)) ||
      ring_bytes > (1ULL << 32))
    throw Napi::RangeError::New(env, "ringBufferBytes must be a power of two between the page size and 4 GiB");
  double interval_ms = number("statsIntervalMs", SVT_STATS_INTERVAL_NS / 1e6);
  if (!(interval_ms >= 10 && interval_ms <= 3600e3))
    throw Napi::RangeError::New(env, "statsIntervalMs must be 10..3600000");
  double detail_rate = number("detailRate", 0);
  if (!(detail_rate >= 0 && detail_rate <= 1e9) || detail_rate != (uint32_t)detail_rate)
    throw Napi::RangeError::New(env, "detailRate must be a whole number of flows per second, 0..1000000000");
  bool bench = opts.Get("benchSource").ToBoolean();
  bool all_packets = opts.Get("allPackets").ToBoolean();
  Napi::Value backend = opts.Get("backend");
  if (!backend.IsUndefined()) {
    std::string b = backend.IsString() ? backend.As<Napi::String>().Utf8Value() : "";
    if (b == "netfilter") backend_ = kBackendNetfilter;
    else if (b == "fentry") backend_ = kBackendFentry;
    else if (b == "kprobe") backend_ = kBackendKprobe;
    else throw Napi::TypeError::New(env, "backend must be \"netfilter\", \"fentry\" or \"kprobe\"");
  }

  skel_ = svctrace_bpf__open();
  if (!skel_) ThrowErrno(env, "svctrace_bpf__open", errno);
  skel_->rodata->targ_snaplen = (uint32_t)snaplen;
  skel_->rodata->targ_all_packets = all_packets ? 1 : 0;
  skel_->rodata->targ_stats_interval_ns = (uint64_t)(interval_ms * 1e6);
  // The kernel keeps the budget per CPU (no shared counter in the packet
  // path): each CPU gets its share, rounded up, so the node's is at least
  // the rate asked for.
  if (detail_rate > 0) {
    int cpus = libbpf_num_possible_cpus();
    if (cpus < 1) cpus = 1;
    skel_->rodata->targ_detail_per_cpu = (uint32_t)(((uint64_t)detail_rate + cpus - 1) / cpus);
  }
  int err = bpf_map__set_max_entries(skel_->maps.svt_events, (uint32_t)ring_bytes);
  if (err) {
    svctrace_bpf__destroy(skel_);
    skel_ = nullptr;
    ThrowErrno(env, "bpf_map__set_max_entries", err, "svt_events");
  }
  ring_bytes_ = ring_bytes;
  // The benchmark event source is loaded only when asked for (bench/).
  bpf_program__set_autoload(skel_->progs.svt_bench_emit, bench);
  // The conntrack destroy handler's programs: one syscall where five were,
  // on the thread that handles every traced connection's end. Linux 5.14
  // brought the program type; before, the handler makes the calls itself.
  destroy_programs_ = libbpf_probe_bpf_prog_type(BPF_PROG_TYPE_SYSCALL, nullptr) == 1;
  bpf_program__set_autoload(skel_->progs.svt_destroy_find, destroy_programs_);
  bpf_program__set_autoload(skel_->progs.svt_destroy_forget, destroy_programs_);
  // Only the chosen backend's programs are loaded: the other's program type
  // or attach target may not exist on this kernel.
  const bool nf = backend_ == kBackendNetfilter;
  bpf_program__set_autoload(skel_->progs.svt_nf_before_nat, nf);
  bpf_program__set_autoload(skel_->progs.svt_nf_after_nat, nf);
  for (bpf_program* p : FentryPrograms(skel_)) bpf_program__set_autoload(p, backend_ == kBackendFentry);
  for (bpf_program* p : KprobePrograms(skel_)) bpf_program__set_autoload(p, backend_ == kBackendKprobe);
  // Entry and exit of NAT's own hook: they sit at NAT's priority.
  if (!nf) skel_->data->svt_prio_gap = 0;
  // One read of the kernel's BTF: which drop program its kfree_skb takes,
  // and the reasons' names (dropReasons()).
  drop_reasons_ = ReadDropReasons();
  bpf_program__set_autoload(skel_->progs.svt_drop, drop_reasons_.has_reason);
  bpf_program__set_autoload(skel_->progs.svt_drop_noreason, !drop_reasons_.has_reason);
  napi_add_env_cleanup_hook(env_, &Tracer::CleanupHook, this);
}

Tracer::~Tracer() {
  Destroy();
}

void Tracer::CleanupHook(void* arg) {
  static_cast<Tracer*>(arg)->Destroy();
}

void Tracer::Destroy() {
  if (closed_) return;
  closed_ = true;
  napi_remove_env_cleanup_hook(env_, &Tracer::CleanupHook, this);
  if (reader_) reader_->Stop();
  reader_.reset();
  for (auto& l : ct_listeners_) l->Stop();
  ct_listeners_.clear();
  for (auto& l : nft_listeners_) l->Stop();
  nft_listeners_.clear();
  on_batch_.Reset();
  // Detach first: the kernel stops running the programs before they go.
  for (bpf_link* l : links_) bpf_link__destroy(l);
  links_.clear();
  svctrace_bpf__destroy(skel_);
  skel_ = nullptr;
}

void Tracer::RequireLoaded(Napi::Env env, const char* method) {
  if (closed_) throw Napi::Error::New(env, std::string("Tracer.") + method + "(): tracer is closed");
  if (!loaded_) throw Napi::Error::New(env, std::string("Tracer.") + method + "(): call load() first");
}

Napi::Value Tracer::Load(const Napi::CallbackInfo& info) {
  if (closed_) throw Napi::Error::New(info.Env(), "Tracer.load(): tracer is closed");
  if (loaded_) return info.Env().Undefined();
  ClearLibbpfLog();
  int err;
  {
    SignalsHeld held;
    err = svctrace_bpf__load(skel_);
  }
  if (err) ThrowErrno(info.Env(), "bpf_object__load", err);
  // Tracepoints (device crossings, drops, routing) and the fentry backend's
  // programs are global; the skeleton attaches them. Netfilter programs have
  // no auto-attach: they are attached per namespace by attachNetfilter().
  err = svctrace_bpf__attach(skel_);
  if (err) ThrowErrno(info.Env(), "bpf_program__attach_trace", err);
  if (backend_ == kBackendFentry) global_links_ = (int)FentryPrograms(skel_).size();
  if (backend_ == kBackendKprobe) global_links_ = (int)KprobePrograms(skel_).size();
  loaded_ = true;
  return info.Env().Undefined();
}

// setServices([{addr, port, proto, id}]): addr is the IPv4 address as a
// host-order uint32 (0 = any address, for NodePorts), port in host order.
// Replaces the whole selection.
Napi::Value Tracer::SetServices(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "setServices");
  if (!info[0].IsArray()) throw Napi::TypeError::New(env, "setServices(services): services must be an array");
  Napi::Array arr = info[0].As<Napi::Array>();
  if (arr.Length() > SVT_MAX_SERVICES)
    throw Napi::RangeError::New(env, "at most " + std::to_string(SVT_MAX_SERVICES) + " services can be traced");

  std::vector<std::pair<svt_service_key, uint32_t>> entries;
  bool have_nodeports = false;
  for (uint32_t i = 0; i < arr.Length(); i++) {
    Napi::Value v = arr.Get(i);
    if (!v.IsObject()) throw Napi::TypeError::New(env, "setServices: each service must be an object");
    Napi::Object o = v.As<Napi::Object>();
    svt_service_key key = {};
    uint32_t port = GetU32(o, "port"), proto = GetU32(o, "proto");
    if (port == 0 || port > 65535) throw Napi::RangeError::New(env, "service port must be 1..65535");
    if (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_SCTP)
      throw Napi::RangeError::New(env, "service proto must be TCP (6), UDP (17) or SCTP (132)");
    key.addr = htonl(GetU32(o, "addr"));
    key.port = htons((uint16_t)port);
    key.proto = (uint8_t)proto;
    if (key.addr == 0) have_nodeports = true;
    entries.emplace_back(key, GetU32(o, "id"));
  }

  std::vector<svt_service_key> keys;
  for (auto& kv : entries) keys.push_back(kv.first);
  // The conntrack listeners' kernel filters first: they keep the new
  // services' destroys before the programs start registering their flows.
  for (auto& l : ct_listeners_) l->FilterServices(keys);

  int fd = bpf_map__fd(skel_->maps.svt_services);
  // Clear, then fill: the selection is small (<= SVT_MAX_SERVICES).
  svt_service_key cur, next;
  void* prev = nullptr;
  std::vector<svt_service_key> old;
  while (bpf_map_get_next_key(fd, prev, &next) == 0) {
    old.push_back(next);
    cur = next;
    prev = &cur;
  }
  for (auto& k : old) bpf_map_delete_elem(fd, &k);
  for (auto& [key, id] : entries) {
    if (bpf_map_update_elem(fd, &key, &id, BPF_ANY) != 0) ThrowErrno(env, "bpf_map_update_elem", errno, "svt_services");
  }
  skel_->bss->svt_have_nodeports = have_nodeports ? 1 : 0;
  // Invalidates the programs' per-CPU cache of "is this connection traced".
  __atomic_add_fetch(&skel_->bss->svt_services_gen, 1, __ATOMIC_RELEASE);
  services_->Replace(keys);
  return Napi::Number::New(env, entries.size());
}

// attachNetfilter(netnsPath): attaches both NAT-stage programs at every point
// of kNfAttachPoints inside that network namespace. Returns
// { netnsIno, links }. All-or-nothing: a failure detaches what it attached.
Napi::Value Tracer::AttachNetfilter(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "attachNetfilter");
  if (!info[0].IsString()) throw Napi::TypeError::New(env, "attachNetfilter(netnsPath): netnsPath must be a string");
  std::string path = info[0].As<Napi::String>();

  // Conntrack DESTROY events of this namespace: how flows are seen to end.
  auto listener = std::make_unique<CtListener>(env, path, NetnsInode(path), services_, bpf_map__fd(skel_->maps.svt_flows),
                                               bpf_map__fd(skel_->maps.svt_flow_state),
                                               bpf_map__fd(skel_->maps.svt_stale_destroys), &skel_->bss->svt_active_flows,
                                               &skel_->bss->svt_stale_owed,
                                               destroy_programs_ ? bpf_program__fd(skel_->progs.svt_destroy_find) : -1,
                                               destroy_programs_ ? bpf_program__fd(skel_->progs.svt_destroy_forget) : -1);
  listener->FilterServices(services_->Keys());

  if (backend_ != kBackendNetfilter) {
    // The programs already run everywhere; they start reporting this
    // namespace once its inode is in their list.
    const uint64_t ino = NetnsInode(path);
    if (ino == 0) ThrowErrno(env, "stat", errno, path);
    bool known = false;
    for (size_t i = 0; i < netns_count_; i++) known |= skel_->bss->svt_netns_inos[i] == (uint32_t)ino;
    if (!known) {
      constexpr size_t kMaxNetns = sizeof(skel_->bss->svt_netns_inos) / sizeof(skel_->bss->svt_netns_inos[0]);
      if (netns_count_ >= kMaxNetns)
        ThrowErrno(env, "attachNetfilter", ENOSPC,
                   "at most " + std::to_string(kMaxNetns) + " namespaces are traced with the fentry and kprobe backends");
      __atomic_store_n(&skel_->bss->svt_netns_inos[netns_count_++], (uint32_t)ino, __ATOMIC_RELEASE);
    }
    if (!on_batch_.IsEmpty()) listener->Start(env, on_batch_.Value(), "svctrace-ct-listener");
    ct_listeners_.push_back(std::move(listener));
    Napi::Object out = Napi::Object::New(env);
    out.Set("netnsIno", Napi::Number::New(env, (double)ino));
    out.Set("links", Napi::Number::New(env, global_links_));
    return out;
  }

  // The kernel refuses a second BPF program at the same hook and priority
  // (EBUSY): another svctrace holds them. Try the next distance from NAT,
  // the same for all eight points; once attached somewhere, an instance
  // keeps its distance (events report it, one per instance).
  std::vector<bpf_link*> attached;
  NetnsResult r;
  const int first_gap = prio_gap_ ? prio_gap_ : 1;
  const int last_gap = prio_gap_ ? prio_gap_ : kMaxPrioGap;
  int gap = first_gap;
  for (; gap <= last_gap; gap++) {
    skel_->data->svt_prio_gap = gap;
    r = RunInNetns(path, [&](NetnsResult& res) {
      for (const NfAttachPoint& p : kNfAttachPoints) {
        const int priority = p.nat_priority + (p.after_nat ? gap : -gap);
        LIBBPF_OPTS(bpf_netfilter_opts, opts, .pf = NFPROTO_IPV4, .hooknum = (__u32)p.hook, .priority = priority);
        bpf_program* prog = p.after_nat ? skel_->progs.svt_nf_after_nat : skel_->progs.svt_nf_before_nat;
        bpf_link* link = bpf_program__attach_netfilter(prog, &opts);
        if (!link) {
          res.op = "bpf_program__attach_netfilter";
          res.detail = "hook " + std::to_string(p.hook) + " priority " + std::to_string(priority) + " in " + path;
          return -errno;
        }
        attached.push_back(link);
      }
      return 0;
    });
    if (r.err == 0) break;
    for (bpf_link* l : attached) bpf_link__destroy(l);
    attached.clear();
    if (r.err != -EBUSY && r.err != EBUSY) break;
  }
  if (r.err != 0) {
    if (r.err == -EBUSY || r.err == EBUSY) {
      r.detail = prio_gap_ ? "this tracer sits " + std::to_string(prio_gap_) + " from NAT, and that is taken in " + path
                           : "every priority within " + std::to_string(kMaxPrioGap) + " of NAT is taken in " + path;
    }
    ThrowErrno(env, r.op, r.err, r.detail);
  }
  prio_gap_ = gap;
  links_.insert(links_.end(), attached.begin(), attached.end());
  if (!on_batch_.IsEmpty()) listener->Start(env, on_batch_.Value(), "svctrace-ct-listener");
  ct_listeners_.push_back(std::move(listener));
  Napi::Object out = Napi::Object::New(env);
  out.Set("netnsIno", Napi::Number::New(env, (double)NetnsInode(path)));
  out.Set("links", Napi::Number::New(env, attached.size()));
  return out;
}

Napi::Value Tracer::Start(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "start");
  if (!info[0].IsFunction()) throw Napi::TypeError::New(env, "start(onBatch): onBatch must be a function");
  if (reader_) throw Napi::Error::New(env, "Tracer.start(): already started");
  Napi::Function fn = info[0].As<Napi::Function>();
  on_batch_ = Napi::Persistent(fn);
  reader_ = std::make_unique<RingReader>(env, bpf_map__fd(skel_->maps.svt_events), fn);
  reader_->Start();
  for (auto& l : ct_listeners_) l->Start(env, fn, "svctrace-ct-listener");
  return env.Undefined();
}

// stats(): kernel-side counters summed over CPUs, plus the reader's own.
Napi::Value Tracer::Stats(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "stats");
  return StatsObject(env);
}

// deliveryIdle() -> true when everything the ring produced so far has
// reached JS: stats()'s ringBacklogBytes, readerPending and batchesInFlight
// all zero, read in the same order. Three loads and no syscall: JS asks
// once per batch and every 10 ms while netlink batches wait, where stats()
// (every per-CPU counter and every program's info, a few dozen syscalls
// and an object of thirty numbers) cost the JS thread 6% of its time under
// short connections.
Napi::Value Tracer::DeliveryIdle(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "deliveryIdle");
  const bool idle = !reader_ || (reader_->ring_bytes() == 0 && reader_->pending() == 0 && reader_->in_flight() == 0);
  return Napi::Boolean::New(env, idle);
}

// flushListeners() -> gen: asks every netlink listener (conntrack destroys,
// rule traces) to hand JS what its socket holds now, at once (see
// NetlinkListener::AskFlush). listenersFlushed(gen) -> true once they all
// have and JS has handled those batches. A drain at stop waits for both.
Napi::Value Tracer::FlushListeners(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "flushListeners");
  const uint64_t gen = ++listener_flush_gen_;
  for (auto& l : ct_listeners_) l->AskFlush(gen);
  for (auto& l : nft_listeners_) l->AskFlush(gen);
  return Napi::Number::New(env, (double)gen);
}

Napi::Value Tracer::ListenersFlushed(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "listenersFlushed");
  if (info.Length() < 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "listenersFlushed(gen): gen must be a number");
  const uint64_t gen = (uint64_t)info[0].As<Napi::Number>().Int64Value();
  bool done = true;
  for (auto& l : ct_listeners_) done = done && l->Flushed(gen);
  for (auto& l : nft_listeners_) done = done && l->Flushed(gen);
  return Napi::Boolean::New(env, done);
}

Napi::Object Tracer::StatsObject(Napi::Env env) {
  int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) ThrowErrno(env, "libbpf_num_possible_cpus", ncpu);
  std::vector<__u64> values((size_t)ncpu);
  __u64 sums[SVT_CNT_MAX] = {};
  for (__u32 idx = 0; idx < SVT_CNT_MAX; idx++) {
    if (bpf_map__lookup_elem(skel_->maps.svt_counters, &idx, sizeof(idx), values.data(),
                             values.size() * sizeof(__u64), 0) != 0)
      ThrowErrno(env, "bpf_map__lookup_elem", errno, "svt_counters");
    for (__u64 v : values) sums[idx] += v;
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("kernelEvents", Napi::Number::New(env, (double)sums[SVT_CNT_EVENTS]));
  out.Set("ringbufLost", Napi::Number::New(env, (double)sums[SVT_CNT_RINGBUF_LOST]));
  out.Set("flowsStarted", Napi::Number::New(env, (double)sums[SVT_CNT_FLOWS]));
  // The kernel's count, and the listeners' states lost in a race (below).
  uint64_t states_lost_in_race = 0;
  for (auto& l : ct_listeners_) states_lost_in_race += l->states_lost_in_race();
  out.Set("flowStateFull", Napi::Number::New(env, (double)(sums[SVT_CNT_STATE_FULL] + states_lost_in_race)));
  out.Set("flowsUnseen", Napi::Number::New(env, (double)sums[SVT_CNT_FLOWS_UNSEEN]));
  out.Set("flowsUnseenReset", Napi::Number::New(env, (double)sums[SVT_CNT_FLOWS_UNSEEN_RESET]));
  out.Set("natExitUnmatched", Napi::Number::New(env, (double)sums[SVT_CNT_NAT_EXIT_UNMATCHED]));
  out.Set("flowsCountedOnly", Napi::Number::New(env, (double)sums[SVT_CNT_FLOWS_COUNTED_ONLY]));
  out.Set("packetsCounted", Napi::Number::New(env, (double)sums[SVT_CNT_PACKETS]));
  out.Set("ringBufferBytes", Napi::Number::New(env, (double)ring_bytes_));
  out.Set("recordsRead", Napi::Number::New(env, reader_ ? (double)reader_->records_read() : 0));
  out.Set("batchesDelivered", Napi::Number::New(env, reader_ ? (double)reader_->batches_delivered() : 0));
  out.Set("readerLostAtClose", Napi::Number::New(env, reader_ ? (double)reader_->lost_at_close() : 0));
  out.Set("readerHeldBack", Napi::Number::New(env, reader_ ? (double)reader_->held_back() : 0));
  out.Set("malformed", Napi::Number::New(env, reader_ ? (double)reader_->malformed() : 0));
  // Not yet delivered: bytes in the ring, records pending in the reader,
  // batches JS has not returned. All zero: everything so far reached JS.
  // Read in this order: the reader counts a record as pending before it
  // frees its space in the ring, and as in flight before it stops counting
  // it as pending (RingReader::Consume, BatchSink::Flush).
  out.Set("ringBacklogBytes", Napi::Number::New(env, reader_ ? (double)reader_->ring_bytes() : 0));
  out.Set("readerPending", Napi::Number::New(env, reader_ ? (double)reader_->pending() : 0));
  out.Set("batchesInFlight", Napi::Number::New(env, reader_ ? (double)reader_->in_flight() : 0));
  out.Set("links", Napi::Number::New(env, links_.size() + global_links_));
  out.Set("backend", Napi::String::New(env, backend_ == kBackendFentry  ? "fentry"
                                           : backend_ == kBackendKprobe ? "kprobe"
                                                                        : "netfilter"));
  uint64_t ct_events = 0, ct_overruns = 0, listener_lost = 0, packets_missed = 0, ct_read = 0;
  for (auto& l : ct_listeners_) {
    packets_missed += l->packets_missed();
    ct_read += l->messages_read();
    ct_events += l->events();
    ct_overruns += l->overruns();
    listener_lost += l->lost_at_close();
  }
  uint64_t runs_skipped = 0;
  for (const ProgramInfo& p : LoadedPrograms(skel_->obj)) runs_skipped += p.info.recursion_misses;
  out.Set("hookRunsSkipped", Napi::Number::New(env, (double)runs_skipped));
  out.Set("activeFlows", Napi::Number::New(env, (double)skel_->bss->svt_active_flows));
  out.Set("staleDestroysOwed", Napi::Number::New(env, (double)skel_->bss->svt_stale_owed));
  out.Set("ctDestroyEvents", Napi::Number::New(env, (double)ct_events));
  // Destroy messages the listeners read, of any service: with their kernel
  // filters, only traced services' entries' (ct_filter.h).
  out.Set("ctDestroysRead", Napi::Number::New(env, (double)ct_read));
  // Destroys handled with the kernel's help (svt_destroy_find/forget).
  bool destroy_programs = destroy_programs_;
  for (auto& l : ct_listeners_) destroy_programs &= l->destroy_programs_ran();
  out.Set("ctDestroyPrograms", Napi::Boolean::New(env, destroy_programs));
  out.Set("packetsMissedByHooks", Napi::Number::New(env, (double)packets_missed));
  uint64_t nft_events = 0, nft_overruns = 0;
  for (auto& l : nft_listeners_) {
    nft_events += l->events();
    nft_overruns += l->overruns();
    listener_lost += l->lost_at_close();
  }
  out.Set("ruleTraceEvents", Napi::Number::New(env, (double)nft_events));
  out.Set("ctOverruns", Napi::Number::New(env, (double)ct_overruns));
  out.Set("ruleTraceOverruns", Napi::Number::New(env, (double)nft_overruns));
  out.Set("listenerLostAtClose", Napi::Number::New(env, (double)listener_lost));
  return out;
}

// benchEmit(count, flows): runs the benchmark source once: `count` synthetic
// events of `flows` flows into the ring buffer. Needs new Tracer({benchSource: true}).
Napi::Value Tracer::BenchEmit(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "benchEmit");
  if (!bpf_program__autoload(skel_->progs.svt_bench_emit))
    throw Napi::Error::New(env, "Tracer.benchEmit(): create the tracer with { benchSource: true }");
  if (!info[0].IsNumber() || !info[1].IsNumber()) throw Napi::TypeError::New(env, "benchEmit(count, flows)");
  skel_->bss->bench_count = info[0].As<Napi::Number>().Uint32Value();
  skel_->bss->bench_flows = info[1].As<Napi::Number>().Uint32Value();
  LIBBPF_OPTS(bpf_test_run_opts, opts);
  int err = bpf_prog_test_run_opts(bpf_program__fd(skel_->progs.svt_bench_emit), &opts);
  if (err) ThrowErrno(env, "bpf_prog_test_run_opts", errno);
  return env.Undefined();
}

// traceRules(netnsPath, onBatch): reads nftables trace messages in that
// namespace and hands batches of struct svt_nftrace to onBatch(buffer, count).
// Marking packets for tracing (meta nftrace set 1) is the caller's job.
Napi::Value Tracer::TraceRules(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "traceRules");
  if (!info[0].IsString() || !info[1].IsFunction()) throw Napi::TypeError::New(env, "traceRules(netnsPath, onBatch)");
  std::string path = info[0].As<Napi::String>();
  auto l = std::make_unique<NftTraceListener>(env, path, NetnsInode(path));
  l->Start(env, info[1].As<Napi::Function>(), "svctrace-nftrace");
  nft_listeners_.push_back(std::move(l));
  return env.Undefined();
}

// The svt_flow_state entries as svt_flow_stats records: all of them
// (snapshot, SVT_STATS_PERIODIC), or those that counted no packet for
// idle_ns, removed (SVT_STATS_EXPIRED).
Napi::Value Tracer::CollectFlowState(Napi::Env env, bool expire, uint64_t idle_ns) {
  uint64_t now = MonotonicNs();
  int fd = bpf_map__fd(skel_->maps.svt_flow_state);
  std::vector<__u64> keys;
  __u64 key, *prev = nullptr;
  svt_flow_counters c;
  while (bpf_map_get_next_key(fd, prev, &key) == 0) {
    if (!expire || (bpf_map_lookup_elem(fd, &key, &c) == 0 && now > c.last_ns && now - c.last_ns >= idle_ns))
      keys.push_back(key);
    prev = &key;
  }
  std::vector<uint8_t> out;
  const int flows_fd = bpf_map__fd(skel_->maps.svt_flows);
  for (__u64 k : keys) {
    svt_flow_stats r = {};
    int err = expire ? TakeMapElem(fd, &k, &r.c) : bpf_map_lookup_elem(fd, &k, &r.c);
    if (err != 0) continue;
    // An expired flow's destroy never came: nothing else forgets its wire
    // tuples, which took the registry's room until its LRU evicted live
    // flows' for them, and kept svt_active_flows above zero, so that the
    // device hooks looked up every packet of the node for ever.
    if (expire && ForgetOwnFlowRefs(flows_fd, r.c, k)) Decrement(&skel_->bss->svt_active_flows);
    r.kind = SVT_EV_FLOW_STATS;
    r.size = sizeof(r);
    r.ts_ns = now;
    r.ct_id = k;
    r.reason = expire ? SVT_STATS_EXPIRED : SVT_STATS_PERIODIC;
    const auto* b = reinterpret_cast<const uint8_t*>(&r);
    out.insert(out.end(), b, b + sizeof(r));
  }
  return Napi::Buffer<uint8_t>::Copy(env, out.data(), out.size());
}

// expireFlowState(idleMs): removes the kernel state of flows that counted no
// packet for idleMs (their destroy was missed: an LRU-forgotten tuple, a
// netlink overrun, an entry that never got confirmed) and returns their
// final counters (SVT_STATS_EXPIRED), so svt_flow_state never fills up with
// the dead.
Napi::Value Tracer::ExpireFlowState(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "expireFlowState");
  if (!info[0].IsNumber()) throw Napi::TypeError::New(env, "expireFlowState(idleMs)");
  return CollectFlowState(env, true, (uint64_t)(info[0].As<Napi::Number>().DoubleValue() * 1e6));
}

// snapshotFlowState(): every tracked flow's counters now (SVT_STATS_PERIODIC),
// for a judgement that cannot wait for the next periodic record.
Napi::Value Tracer::SnapshotFlowState(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "snapshotFlowState");
  return CollectFlowState(env, false, 0);
}

// close() -> the last stats (undefined when already closed or never
// loaded). Taken after the programs are detached and the reader and
// listeners stopped: nothing is written after them, and what was never
// handed to JS (records a drain that ran out of time left in the ring) is
// in readerLostAtClose.
Napi::Value Tracer::Close(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (closed_) return env.Undefined();
  for (bpf_link* l : links_) bpf_link__destroy(l);
  links_.clear();
  if (skel_) svctrace_bpf__detach(skel_);
  if (reader_) reader_->Stop();
  for (auto& l : ct_listeners_) l->Stop();
  for (auto& l : nft_listeners_) l->Stop();
  Napi::Value last = env.Undefined();
  if (loaded_) {
    try {
      last = StatsObject(env);
    } catch (const Napi::Error&) {
      // closing matters more than its numbers
    }
  }
  Destroy();
  return last;
}

// programs() -> [{ name, id, runs, runTimeNs, runsSkipped }]: the loaded
// programs as the kernel reports them (bpftool prog show), for a user
// measuring svctrace's own cost and for the test that checks hookRunsSkipped.
Napi::Value Tracer::Programs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "programs");
  std::vector<ProgramInfo> progs = LoadedPrograms(skel_->obj);
  Napi::Array out = Napi::Array::New(env, progs.size());
  for (size_t i = 0; i < progs.size(); i++) {
    Napi::Object o = Napi::Object::New(env);
    o.Set("name", progs[i].name);
    o.Set("id", Napi::Number::New(env, progs[i].info.id));
    o.Set("runs", Napi::Number::New(env, (double)progs[i].info.run_cnt));
    o.Set("runTimeNs", Napi::Number::New(env, (double)progs[i].info.run_time_ns));
    o.Set("runsSkipped", Napi::Number::New(env, (double)progs[i].info.recursion_misses));
    out.Set((uint32_t)i, o);
  }
  return out;
}

// dropReasons() -> { [value]: 'NO_SOCKET', ... }: this kernel's drop reasons
// (read with the BTF when the tracer was made).
Napi::Value Tracer::DropReasons(const Napi::CallbackInfo& info) {
  Napi::Object out = Napi::Object::New(info.Env());
  for (const auto& [value, name] : drop_reasons_.names) out.Set(std::to_string(value), name);
  return out;
}

}  // namespace svt
