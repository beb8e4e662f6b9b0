#!/usr/bin/env bash
# Regenerates test/fixtures/kube-proxy-nft.json: the lab's kube-proxy-format
# nftables table (src/lab/kube-rules.ts) loaded into a throwaway network
# namespace and listed by nft as libnftables JSON, which is what discovery
# reads on a node (`nft -j list table ip kube-proxy`). Root; after a build.
set -euo pipefail
cd "$(dirname "$0")/.."
ns="svt-$$-$(printf %x "$(date +%s)")-fixture"
trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
ip netns add "$ns"
node -e "
const { renderNftKubeProxy } = require('./dist/src/lab/kube-rules.js');
const eps = [10, 11, 12].map((h) => ({ ip: '10.244.1.' + h, port: 8080 }));
process.stdout.write(renderNftKubeProxy([
  { namespace: 'default', name: 'web', portName: 'http', clusterIP: '10.96.0.100', port: 80, proto: 'tcp', nodePort: 30080, endpoints: eps },
  { namespace: 'kube-system', name: 'kube-dns', portName: 'dns', clusterIP: '10.96.0.10', port: 53, proto: 'udp', endpoints: eps.map((e) => ({ ...e, port: 5353 })).slice(0, 2) },
  { namespace: 'default', name: 'empty', portName: 'http', clusterIP: '10.96.0.200', port: 80, proto: 'tcp', endpoints: [] },
], { clusterCIDR: '10.244.0.0/16' }));
" | ip netns exec "$ns" nft -f -
ip netns exec "$ns" nft -j list table ip kube-proxy | python3 -m json.tool > test/fixtures/kube-proxy-nft.json
echo "wrote test/fixtures/kube-proxy-nft.json"
