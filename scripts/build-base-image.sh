#!/usr/bin/env bash
# Build a local Debian base image with Python 3 (mmdebstrap, Debian registry only) for the container image test,
# where no public registry (python:3.12-slim) can be reached. The root filesystem tarball is cached outside the
# repository, keyed by the Debian release and the python3 package version; the image is imported into the
# local container storage once. Prints the image name on stdout. Recipe: shared/reference/containers.md.
set -euo pipefail
CACHE=${NIGHTSHIFT_CACHE:-$HOME/.cache/nightshift}
SUITE=${BASE_SUITE:-bookworm}
PYVER=$(apt-cache show --no-all-versions python3 2>/dev/null | sed -n 's/^Version: //p' | head -1)
[ -n "$PYVER" ] || { echo "apt-cache knows no python3: run apt-get update" >&2; exit 1; }
KEY="$SUITE-python3-${PYVER//[^A-Za-z0-9.-]/_}"  # also a valid image tag
IMAGE="localhost/nightshift-base:$KEY"
TAR="$CACHE/debian-python-$KEY.tar"
for tool in mmdebstrap podman buildah; do
  command -v "$tool" >/dev/null || { echo "$tool not found: run make deps" >&2; exit 1; }
done
if [ ! -s "$TAR" ]; then
  mkdir -p "$CACHE"
  echo "building $TAR with mmdebstrap (about 15 s)..." >&2
  mmdebstrap --quiet --format=tar --variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE" "$TAR.tmp" >&2
  mv "$TAR.tmp" "$TAR"
fi
if ! buildah inspect --type image "$IMAGE" >/dev/null 2>&1; then
  podman import --quiet "$TAR" "$IMAGE" >/dev/null
fi
echo "$IMAGE"
