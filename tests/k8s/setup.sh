#!/usr/bin/env bash
# Sets up what gantry's tests need beyond Rust, idempotently:
#
#   postgres   PostgreSQL 15 from Debian's packages, on 127.0.0.1:5432 with
#              trust auth for local TCP and a database `test` (needs root).
#   k8s        etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#              kubectl and kwok
#              built from the Go modules pinned in tests/k8s/tools/*/go.mod,
#              into a cache outside the clone keyed by those pins and the Go
#              version; a second run finds them there and takes seconds.
#   etcd       Debian's etcd-server (etcd 3.4): the anchor `gantry-bench
#              versus` runs side by side with gantry (needs root).
#   promtool   Debian's prometheus package, for `promtool check rules` and
#              `promtool test rules` on deploy/monitoring (needs root).
#   node       a real node next to the control plane: containerd, runc and
#              the CNI plugins from Debian's packages, kubelet and kube-proxy
#              built from tests/k8s/tools/node (the control plane's release)
#              and CoreDNS from tests/k8s/tools/coredns, cached like it
#              (needs root).
#   node-bin   print where the node's binaries are (or would be).
#   image      skopeo, umoci and busybox-static from Debian's packages: the
#              image tests read deploy/image/build.sh's archive with skopeo.
#   shells     zsh and fish from Debian's packages, whose completion
#              functions the gatewayctl tests drive (bash is there already).
#   grpcurl    grpcurl built from the Go module pinned in tests/tools/grpcurl,
#              cached like the control plane (keyed by its pins and Go).
#   bin-dir    print the directory the k8s binaries are (or would be) in, and
#              build nothing; the Rust test harness asks this.
#   grpcurl-bin  print where grpcurl is (or would be), building nothing.
#   all        postgres, etcd, promtool, image, shells, grpcurl, k8s, then
#              node (the default).
#
# Everything is fetched through Debian's packages and the Go module proxy.
# GANTRY_K8S_CACHE moves the cache (default ~/.cache/gantry/k8s).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
tools="$here/tools"
export GOTOOLCHAIN=local
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

# Kubernetes release built from tools/kube/go.mod; stamped into the binaries
# so that /version and `kubectl version` tell the truth.
kube_version() { grep -oE 'k8s.io/kubernetes v[0-9]+\.[0-9]+\.[0-9]+' "$tools/kube/go.mod" | head -n1 | cut -d' ' -f2; }

node_bin() {
  local key
  key="$( (cat "$tools"/{node,coredns}/go.mod "$tools"/{node,coredns}/go.sum; go env GOVERSION) | sha256sum | cut -c1-16)"
  echo "$(cache_root)/node-$(kube_version)-$key/bin"
}

setup_node() {
  local dir tmp version minor ldflags
  if ! command -v containerd >/dev/null || ! command -v runc >/dev/null || [ ! -x /usr/lib/cni/bridge ]; then
    echo "node: installing containerd, runc and the CNI plugins from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq containerd runc containernetworking-plugins iptables >/dev/null
  fi
  dir="$(node_bin)"
  if [ -x "$dir/kubelet" ] && [ -x "$dir/kube-proxy" ] && [ -x "$dir/coredns" ]; then
    echo "node: kubelet, kube-proxy and coredns cached in $dir"
    return
  fi
  command -v go >/dev/null || { echo "node: Go is needed to build the kubelet (go 1.26)" >&2; exit 1; }
  echo "node: building kubelet, kube-proxy and coredns into $dir (cold: a few minutes after the control plane)"
  tmp="$dir.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  version="$(kube_version)"
  minor="$(echo "$version" | cut -d. -f2)"
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  (cd "$tools/node" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
  (cd "$tools/coredns" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/coredns" github.com/coredns/coredns)
  rm -rf "$dir"
  mv "$tmp" "$dir"
  echo "node: built kubelet, kube-proxy and coredns into $dir"
}

setup_image() {
  if ! command -v skopeo >/dev/null || ! command -v umoci >/dev/null || ! command -v busybox >/dev/null; then
    echo "image: installing skopeo, umoci and busybox-static from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq skopeo umoci busybox-static >/dev/null
  fi
  echo "image: $(skopeo --version), $(umoci --version)"
}

setup_shells() {
  if ! command -v zsh >/dev/null || ! command -v fish >/dev/null; then
    echo "shells: installing zsh and fish from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq zsh fish >/dev/null
  fi
  echo "shells: $(zsh --version | head -n1), $(fish --version 2>&1 | head -n1)"
}

cache_root() { echo "${GANTRY_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gantry/k8s}"; }

grpcurl_bin() {
  local mod="$here/../tools/grpcurl" key version
  key="$( (cat "$mod/go.mod" "$mod/go.sum"; go env GOVERSION) | sha256sum | cut -c1-16)"
  version="$(grep -oE 'github.com/fullstorydev/grpcurl v[0-9.]+' "$mod/go.mod" | cut -d' ' -f2)"
  echo "$(cache_root)/grpcurl-$version-$key/grpcurl"
}

setup_grpcurl() {
  local bin mod="$here/../tools/grpcurl" version
  bin="$(grpcurl_bin)"
  if [ -x "$bin" ]; then
    echo "grpcurl: cached at $bin"
    return
  fi
  command -v go >/dev/null || { echo "grpcurl: Go is needed to build it (go 1.26)" >&2; exit 1; }
  version="$(grep -oE 'github.com/fullstorydev/grpcurl v[0-9.]+' "$mod/go.mod" | cut -d' ' -f2)"
  mkdir -p "$(dirname "$bin")"
  (cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$bin.tmp.$$" \
    github.com/fullstorydev/grpcurl/cmd/grpcurl)
  mv "$bin.tmp.$$" "$bin"
  echo "grpcurl: built $version into $bin"
}

bin_dir() {
  local key
  key="$( (cat "$tools"/{etcd,kube,kwok}/go.mod "$tools"/{etcd,kube,kwok}/go.sum; go env GOVERSION) | sha256sum | cut -c1-16)"
  echo "$(cache_root)/$(kube_version)-$key/bin"
}

setup_postgres() {
  local cluster_version=15 hba conf
  if ! command -v pg_ctlcluster >/dev/null || [ ! -d "/usr/lib/postgresql/$cluster_version" ]; then
    echo "postgres: installing postgresql-$cluster_version from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "postgresql-$cluster_version" postgresql-client >/dev/null
  fi
  if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$cluster_version main"; then
    pg_createcluster "$cluster_version" main >/dev/null
  fi
  hba="/etc/postgresql/$cluster_version/main/pg_hba.conf"
  conf="/etc/postgresql/$cluster_version/main/postgresql.conf"
  if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
    # Tests connect as postgres over TCP without a password.
    sed -i '/^host\s/d' "$hba"
    printf 'host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n' >>"$hba"
    pg_ctlcluster "$cluster_version" main stop >/dev/null 2>&1 || true
  fi
  grep -q "^listen_addresses = '127.0.0.1'" "$conf" || echo "listen_addresses = '127.0.0.1'" >>"$conf"
  grep -q '^max_connections = 400' "$conf" || echo 'max_connections = 400' >>"$conf"
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    pg_ctlcluster --skip-systemctl-redirect "$cluster_version" main start
  fi
  for _ in $(seq 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
  if ! psql -h 127.0.0.1 -U postgres -Atc "select 1 from pg_database where datname = 'test'" | grep -q 1; then
    psql -h 127.0.0.1 -U postgres -qc 'create database test'
  fi
  echo "postgres: ready on 127.0.0.1:5432 (database test, trust auth)"
}

setup_etcd() {
  if ! command -v etcd >/dev/null; then
    echo "etcd: installing etcd-server from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq etcd-server >/dev/null
  fi
  echo "etcd: $(etcd --version | head -n1) (started by gantry-bench versus, not here)"
}

setup_promtool() {
  if ! command -v promtool >/dev/null; then
    echo "promtool: installing prometheus from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  fi
  echo "promtool: $(promtool --version 2>&1 | head -n1)"
}

setup_k8s() {
  local dir tmp version minor ldflags
  dir="$(bin_dir)"
  local missing=""
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok; do
    [ -x "$dir/$b" ] || missing="$missing $b"
  done
  if [ -z "$missing" ]; then
    echo "k8s: binaries cached in $dir"
    return
  fi
  command -v go >/dev/null || { echo "k8s: Go is needed to build the control plane (go 1.26)" >&2; exit 1; }
  echo "k8s: building the control plane into $dir (cold: about 15 minutes on 2 cores)"
  tmp="$dir.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  version="$(kube_version)"
  minor="$(echo "$version" | cut -d. -f2)"
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  export CGO_ENABLED=0
  (cd "$tools/etcd" && go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
  (cd "$tools/kwok" && go build -trimpath -ldflags "-s -w" -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok)
  (cd "$tools/kube" && go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  rm -rf "$dir"
  mv "$tmp" "$dir"
  echo "k8s: built $(ls "$dir" | tr '\n' ' ')in $dir"
}

case "${1:-all}" in
  postgres) setup_postgres ;;
  k8s) setup_k8s ;;
  bin-dir) bin_dir ;;
  etcd) setup_etcd ;;
  promtool) setup_promtool ;;
  grpcurl) setup_grpcurl ;;
  shells) setup_shells ;;
  image) setup_image ;;
  node) setup_node ;;
  node-bin) node_bin ;;
  grpcurl-bin) grpcurl_bin ;;
  all) setup_postgres; setup_etcd; setup_promtool; setup_image; setup_shells; setup_grpcurl; setup_k8s; setup_node ;;
  *) echo "usage: $0 [all|postgres|etcd|promtool|image|shells|grpcurl|k8s|node|bin-dir|grpcurl-bin|node-bin]" >&2; exit 2 ;;
esac
