// One error idiom for the addon: every libbpf/kernel failure becomes a JS
// Error carrying `code` (errno name, e.g. 'EPERM'), `errno` (positive number),
// `op` (the failing operation) and a sentence a person can act on.
#pragma once

#include <napi.h>

#include <string>

namespace svt {

// Name of a positive errno value ("EPERM"), or "E<number>" when unknown.
std::string ErrnoName(int err);

// A human sentence for `err` during `op`, with a hint when one is known.
std::string DescribeFailure(const std::string& op, int err, const std::string& detail);

// Throws a JS Error (as a C++ Napi::Error) for a failed libbpf/kernel call.
// `err` may be negative (libbpf style) or positive (errno).
[[noreturn]] void ThrowErrno(Napi::Env env, const std::string& op, int err,
                             const std::string& detail = std::string());

// libbpf's print callback feeds a bounded log of recent lines; the tail is
// attached to load failures (the verifier's explanation).
void InstallLibbpfLogger();
std::string LibbpfLogTail(size_t max_lines);
void ClearLibbpfLog();

}  // namespace svt
