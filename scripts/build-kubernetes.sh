#!/usr/bin/env bash
# Build Kubernetes programs from Debian's own `kubernetes` source package (offline: the Debian registry only) and
# cache each outside the repository, keyed by the Debian source version: $CACHE/<name>-<version>/<name>.
#   scripts/build-kubernetes.sh kube-apiserver kubelet kube-scheduler kube-controller-manager pause
# prints the path of each program named, one a line, in the order given; it builds only the missing ones, all in one
# `make` (they share most packages). Names: a cmd/<name> of the tree (Go, CGO off: static, as upstream builds the
# control plane; kubelet too), or `pause`, the pod sandbox's process (build/pause/linux/pause.c, static, with gcc as
# upstream's build/pause/Makefile does). Cold on 2 cores: about 6 min for kube-apiserver alone (idle machine); the
# kubelet, scheduler and controller-manager together took 29 min on 2 cores shared with other builds (load ~10).
# Recipe: shared/reference/kubernetes-grafana.md.
# Trap: the vendored modern-go/reflect2 v1.0.1 segfaults under Go >= 1.18; swap in Debian's 1.0.2.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 NAME... (kube-apiserver, kubelet, kube-scheduler, kube-controller-manager, pause...)" >&2; exit 2; }
for name in "$@"; do
  [[ $name =~ ^[a-z][a-z0-9-]*$ ]] || { echo "not a program name: $name" >&2; exit 2; }
done
CACHE=${NIGHTSHIFT_CACHE:-$HOME/.cache/nightshift}
export DEBIAN_FRONTEND=noninteractive
# kubernetes-client is built from the same source package, so its version keys the cache without deb-src lists.
VER=$(apt-cache show --no-all-versions kubernetes-client 2>/dev/null | sed -n 's/^Version: //p' | head -1)
[ -n "$VER" ] || { apt-get update -qq >&2; VER=$(apt-cache show --no-all-versions kubernetes-client | sed -n 's/^Version: //p' | head -1); }
path_of() { echo "$CACHE/$1-${VER//[^A-Za-z0-9.+-]/_}/$1"; }
missing() { for name in "$@"; do [ -x "$(path_of "$name")" ] || echo "$name"; done; }
mapfile -t todo < <(missing "$@")
if [ ${#todo[@]} -gt 0 ]; then
  mkdir -p "$CACHE"
  # One build at a time on this machine (parallel test runs share the cache); the winner's result is reused.
  exec 9>"$CACHE/.build-kubernetes.lock"
  flock 9
  mapfile -t todo < <(missing "$@")
fi
if [ ${#todo[@]} -gt 0 ]; then
  command -v go >/dev/null && command -v etcd >/dev/null && command -v rsync >/dev/null && command -v gcc >/dev/null \
    || apt-get install -y -qq --no-install-recommends golang-go etcd-server rsync gcc libc6-dev >&2
  W=$(mktemp -d "${TMPDIR:-/tmp}/kube-build.XXXXXX"); trap 'rm -rf "$W"' EXIT
  cd "$W"
  A=$W/apt; mkdir -p "$A/parts" "$A/lists/partial" "$A/cache/archives/partial"
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$A/parts/debian-src.sources"
  APTO=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$A/parts" -o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache")
  echo "building ${todo[*]} from Debian's kubernetes $VER (minutes: see the header)..." >&2
  apt-get "${APTO[@]}" update -qq >&2
  apt-get "${APTO[@]}" source --download-only kubernetes >/dev/null 2>&1
  apt-get download golang-github-modern-go-reflect2-dev >/dev/null 2>&1
  mkdir src && tar xzf kubernetes_*.orig.tar.gz -C src --strip-components=1
  dpkg-deb -x golang-github-modern-go-reflect2-dev_*.deb r2
  V=src/vendor/github.com/modern-go/reflect2
  find "$V" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) -delete
  cp r2/usr/share/gocode/src/github.com/modern-go/reflect2/*.go r2/usr/share/gocode/src/github.com/modern-go/reflect2/*.s "$V/"
  rm -f "$V"/*_test.go
  cd src
  what=()
  for name in "${todo[@]}"; do
    [ "$name" = pause ] && continue
    [ -d "cmd/$name" ] || { echo "no cmd/$name in Debian's kubernetes $VER" >&2; exit 2; }
    what+=("cmd/$name")
  done
  # The version (v1.20.2 and its commit) comes from the tarball itself: it is a `git archive` export.
  export HOME=$W/home GOPATH=$W/home/go GOCACHE=$W/home/gocache GOFLAGS=-mod=vendor GOPROXY=off CGO_ENABLED=0
  if [ ${#what[@]} -gt 0 ]; then
    # kubelet is not in upstream's static list; it builds without cgo as well.
    KUBE_STATIC_OVERRIDES=kubelet make WHAT="${what[*]}" >"$W/make.log" 2>&1 || { tail -50 "$W/make.log" >&2; exit 1; }
  fi
  if printf '%s\n' "${todo[@]}" | grep -qx pause; then
    tag=$(sed -n 's/^TAG = //p' build/pause/Makefile)
    mkdir -p _output/bin
    gcc -Os -Wall -Werror -static -DVERSION="v$tag-debian-$VER" -o _output/bin/pause build/pause/linux/pause.c
  fi
  for name in "${todo[@]}"; do
    out=$(dirname "$(path_of "$name")")
    mkdir -p "$out.tmp" && cp "_output/bin/$name" "$out.tmp/" && rm -rf "$out" && mv "$out.tmp" "$out"
  done
fi
for name in "$@"; do path_of "$name"; done
