#!/usr/bin/env bash
# Build a real kube-apiserver from Debian's own `kubernetes` source package (offline, Debian registry only)
# and cache it outside the repository, keyed by the Debian source version.
# Prints the path of the binary on stdout. Recipe: shared/reference/kubernetes-grafana.md.
# Trap: the vendored modern-go/reflect2 v1.0.1 segfaults under Go >= 1.18; swap in Debian's 1.0.2.
set -euo pipefail
CACHE=${NIGHTSHIFT_CACHE:-$HOME/.cache/nightshift}
export DEBIAN_FRONTEND=noninteractive
# kubernetes-client is built from the same source package, so its version keys the cache without deb-src lists.
VER=$(apt-cache show --no-all-versions kubernetes-client 2>/dev/null | sed -n 's/^Version: //p' | head -1)
[ -n "$VER" ] || { apt-get update -qq >&2; VER=$(apt-cache show --no-all-versions kubernetes-client | sed -n 's/^Version: //p' | head -1); }
OUT="$CACHE/kube-apiserver-${VER//[^A-Za-z0-9.+-]/_}"
if [ -x "$OUT/kube-apiserver" ]; then echo "$OUT/kube-apiserver"; exit 0; fi
command -v go >/dev/null && command -v etcd >/dev/null && command -v rsync >/dev/null \
  || apt-get install -y -qq --no-install-recommends golang-go etcd-server rsync >&2
W=$(mktemp -d "${TMPDIR:-/tmp}/kube-build.XXXXXX"); trap 'rm -rf "$W"' EXIT
cd "$W"
A=$W/apt; mkdir -p "$A/parts" "$A/lists/partial" "$A/cache/archives/partial"
sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$A/parts/debian-src.sources"
APTO=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$A/parts" -o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache")
echo "building kube-apiserver $VER (about 6 min cold on 2 cores)..." >&2
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
export HOME=$W/home GOPATH=$W/home/go GOCACHE=$W/home/gocache GOFLAGS=-mod=vendor GOPROXY=off CGO_ENABLED=0
export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean KUBE_GIT_COMMIT=faecb196815e248d3ecfb03c680a4507229c2a56
make WHAT=cmd/kube-apiserver >"$W/make.log" 2>&1 || { tail -50 "$W/make.log" >&2; exit 1; }
mkdir -p "$OUT.tmp" && cp _output/bin/kube-apiserver "$OUT.tmp/" && rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
"$OUT/kube-apiserver" --version >&2
echo "$OUT/kube-apiserver"
