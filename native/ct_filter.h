// The conntrack DESTROY listener's socket filter (classic BPF, run by the
// kernel on each message before it is queued to the socket): it keeps the
// destroys of traced services' entries, as ServiceSet::Contains decides, and
// drops the rest. Without it every destroy of the namespace (every ended
// connection to any service, on a busy node thousands a second) is queued,
// read and parsed by the listener thread only to be thrown away, and a burst
// of them can overrun the socket and show as lost destroys of traced flows.
#pragma once

#include <linux/filter.h>

#include <cstddef>
#include <vector>

#include "events.h"

namespace svt {

// Services at most in one filter: past this many the filter would take too
// many instructions per message (and near BPF_MAXINSNS); the listener then
// keeps every destroy and filters in user space, as before.
constexpr size_t kCtFilterMaxServices = 512;

// The program for `keys` (addr, port in network order; addr 0 = any
// address). Empty when there are too many keys. A message whose layout it
// does not know (no CTA_TUPLE_ORIG found: a non-linear buffer, which the
// kernel's attribute search does not read) is kept, for user space to judge.
std::vector<sock_filter> CtDestroyFilter(const std::vector<svt_service_key>& keys);

}  // namespace svt
