// Kernel feature probes for `svctrace doctor`: each probe loads (and where it
// matters attaches) one tiny program from bpf/probe.bpf.c on its own, so the
// answer comes from this kernel, not from its version number or config.
#include "probe.h"

#include <netinet/in.h>  // before the linux/ headers: libc-compat then skips duplicates
#include <linux/types.h>
#include <linux/netfilter.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <errno.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "errors.h"
#include "netns.h"
#include "probe.skel.h"
#include "signals_held.h"

namespace svt {

namespace {

struct ProbeResult {
  bool ok = false;
  int err = 0;
  std::string op;
  std::string detail;
};

// Opens the probe object with only `which` enabled, loads it, then runs
// `attach` (which returns a link or nullptr with errno set).
ProbeResult ProbeProgram(const std::function<bpf_program*(probe_bpf*)>& which,
                         const std::function<int(bpf_program*, ProbeResult&)>& attach) {
  ProbeResult r;
  probe_bpf* skel = probe_bpf__open();
  if (!skel) {
    r.err = -errno;
    r.op = "probe_bpf__open";
    return r;
  }
  bpf_program* wanted = which(skel);
  bpf_program* p;
  bpf_object__for_each_program(p, skel->obj) bpf_program__set_autoload(p, p == wanted);
  int err;
  {
    SignalsHeld held;  // a pending signal makes the verifier give up (EAGAIN)
    err = probe_bpf__load(skel);
  }
  if (err) {
    r.err = err;
    r.op = "load " + std::string(bpf_program__section_name(wanted));
  } else {
    r.err = attach(wanted, r);
    r.ok = r.err == 0;
  }
  probe_bpf__destroy(skel);
  return r;
}

int AttachAndDetach(bpf_program* prog, ProbeResult& r) {
  bpf_link* link = bpf_program__attach(prog);
  if (!link) {
    r.op = "attach " + std::string(bpf_program__section_name(prog));
    return -errno;
  }
  bpf_link__destroy(link);
  return 0;
}

Napi::Object ToJs(Napi::Env env, const ProbeResult& r) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("ok", Napi::Boolean::New(env, r.ok));
  if (!r.ok) {
    o.Set("code", ErrnoName(r.err));
    o.Set("errno", Napi::Number::New(env, r.err < 0 ? -r.err : r.err));
    o.Set("message", DescribeFailure(r.op, r.err, r.detail));
  }
  return o;
}

}  // namespace

// probeFeatures([names]): every probe, or only the named ones (a tracer
// choosing its backend needs one to three of them, not all doctor shows).
Napi::Value ProbeFeatures(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  std::vector<std::string> only;
  if (info.Length() > 0 && info[0].IsArray()) {
    Napi::Array names = info[0].As<Napi::Array>();
    for (uint32_t i = 0; i < names.Length(); i++) {
      Napi::Value v = names.Get(i);
      if (!v.IsString()) throw Napi::TypeError::New(env, "probeFeatures(names): names must be strings");
      only.push_back(v.As<Napi::String>().Utf8Value());
    }
  }
  auto wanted = [&](const char* name) { return only.empty() || std::find(only.begin(), only.end(), name) != only.end(); };

  if (wanted("ringbuf")) {
    ProbeResult ringbuf;
    int rc = libbpf_probe_bpf_map_type(BPF_MAP_TYPE_RINGBUF, nullptr);
    ringbuf.ok = rc == 1;
    ringbuf.err = rc == 1 ? 0 : (rc < 0 ? rc : -EOPNOTSUPP);
    ringbuf.op = "create BPF_MAP_TYPE_RINGBUF";
    out.Set("ringbuf", ToJs(env, ringbuf));
  }

  // A netfilter link is attached inside a throw-away network namespace so the
  // probe never hooks a real one.
  if (wanted("netfilterLink")) {
    out.Set("netfilterLink",
          ToJs(env, ProbeProgram([](probe_bpf* s) { return s->progs.probe_netfilter; },
                                 [](bpf_program* prog, ProbeResult& r) {
                                   NetnsResult nr = RunInFreshNetns([&](NetnsResult& res) {
                                     LIBBPF_OPTS(bpf_netfilter_opts, opts, .pf = NFPROTO_IPV4,
                                                 .hooknum = NF_INET_LOCAL_OUT, .priority = 0);
                                     bpf_link* link = bpf_program__attach_netfilter(prog, &opts);
                                     if (!link) {
                                       res.op = "bpf_program__attach_netfilter";
                                       return -errno;
                                     }
                                     bpf_link__destroy(link);
                                     return 0;
                                   });
                                   r.op = nr.op;
                                   r.detail = nr.detail;
                                   return nr.err;
                                 })));
  }
  if (wanted("tpBtf")) out.Set("tpBtf", ToJs(env, ProbeProgram([](probe_bpf* s) { return s->progs.probe_tp_btf; }, AttachAndDetach)));
  if (wanted("kprobe")) out.Set("kprobe", ToJs(env, ProbeProgram([](probe_bpf* s) { return s->progs.probe_kprobe; }, AttachAndDetach)));
  if (wanted("fentry")) out.Set("fentry", ToJs(env, ProbeProgram([](probe_bpf* s) { return s->progs.probe_fentry; }, AttachAndDetach)));
  if (wanted("natFentry")) out.Set("natFentry", ToJs(env, ProbeProgram([](probe_bpf* s) { return s->progs.probe_nat_fentry; }, AttachAndDetach)));
  if (wanted("natKprobe")) out.Set("natKprobe", ToJs(env, ProbeProgram([](probe_bpf* s) { return s->progs.probe_nat_kprobe; }, AttachAndDetach)));
  if (wanted("dropReason")) out.Set("dropReason", ToJs(env, ProbeProgram([](probe_bpf* s) { return s->progs.probe_drop_reason; }, AttachAndDetach)));
  return out;
}

}  // namespace svt
