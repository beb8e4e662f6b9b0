#!/usr/bin/env bash
# npm run image: localhost/svctrace:<version> in podman's local storage, made
# from Debian's packages alone (no registry base image):
#   1. the build, the prebuilt addon and npm pack: the same tarball a node installs;
#   2. mmdebstrap: a minimal Debian trixie root with Node.js 20 (Debian's nodejs)
#      and the commands explain, record and the snapshots read the node with;
#   3. the tarball unpacked as npm install --global would (its dependencies are
#      bundled, it has no install scripts), docs and apt lists dropped;
#   4. podman import, with the entrypoint and labels.
# trixie, not bookworm: bookworm's nodejs is 18; svctrace needs Node >= 20.
# The prebuilt addon needs glibc >= 2.34 (scripts/prebuild.sh), trixie has 2.41.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in mmdebstrap podman; do
  command -v "$tool" >/dev/null || { echo "image: $tool is not installed (scripts/setup-system.sh installs it)" >&2; exit 1; }
done
version=$(node -p "require('./package.json').version")
tag=${SVT_IMAGE_TAG:-localhost/svctrace:$version}
work=$(mktemp -d /tmp/svctrace-image.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The same tarball `npm pack` makes. SVT_IMAGE_NO_BUILD=1 packs the build
# that is there (the image test, which runs from that build).
if [ "${SVT_IMAGE_NO_BUILD:-}" != 1 ]; then
  echo "image: building"
  npm run --silent build >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; exit 1; }
fi
echo "image: packing svctrace $version"
bash scripts/prebuild.sh
npm pack --silent --ignore-scripts --pack-destination "$work" >/dev/null
tgz=$(ls "$work"/svctrace-*.tgz)

# What the image runs besides Node: nft/iptables/ipvsadm/ipset read kube-proxy's
# rules, conntrack and ip the node's state, nsenter (util-linux) enters namespaces.
tools=nodejs,iptables,nftables,conntrack,iproute2,ipvsadm,ipset
echo "image: making the Debian root (mmdebstrap trixie, $tools)"
mmdebstrap --variant=minbase --mode=root --format=tar --quiet \
  --include="$tools" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook="mkdir -p \"\$1/usr/local/lib/node_modules/svctrace\" && tar -xzf '$tgz' -C \"\$1/usr/local/lib/node_modules/svctrace\" --strip-components=1 --no-same-owner" \
  --customize-hook='ln -s ../lib/node_modules/svctrace/bin/svctrace.js "$1/usr/local/bin/svctrace"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  trixie "$work/root.tar" http://deb.debian.org/debian

echo "image: importing $tag"
podman import --quiet \
  --change 'ENTRYPOINT ["/usr/local/bin/svctrace"]' \
  --change 'CMD ["doctor"]' \
  --change 'ENV NODE_ENV=production' \
  --change "LABEL org.opencontainers.image.title=svctrace org.opencontainers.image.version=$version org.opencontainers.image.description=\"live packet tracer for Kubernetes Service traffic\"" \
  "$work/root.tar" "$tag" >/dev/null
echo "image: $tag ($(podman image inspect --format '{{.Size}}' "$tag" | awk '{ printf "%d MB", $1 / 1e6 }'))"
