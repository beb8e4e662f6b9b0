// Collecting netlink attributes by type with libmnl (one nesting level).
#pragma once

#include <libmnl/libmnl.h>

namespace svt {

template <int N>
struct Attrs {
  const nlattr* a[N + 1] = {};
};

template <int N>
int CollectAttr(const nlattr* attr, void* data) {
  auto* out = static_cast<Attrs<N>*>(data);
  int type = mnl_attr_get_type(attr);
  if (type >= 0 && type <= N) out->a[type] = attr;
  return MNL_CB_OK;
}

template <int N>
Attrs<N> Nested(const nlattr* nest) {
  Attrs<N> out;
  if (nest) mnl_attr_parse_nested(nest, CollectAttr<N>, &out);
  return out;
}

}  // namespace svt
