#!/usr/bin/env bash
# The images the real kubelet's nodes run (tests/fixtures/kube_nodes.py), built with buildah and saved as OCI
# archives with uncompressed layers (containerd imports those about twice as fast) outside the repository:
#   - the pod sandbox image: the pause program of Debian's kubernetes source (scripts/build-kubernetes.sh pause);
#   - the training image, docker/trainer.Dockerfile (sim.torch_trainer, torch's CPU build, the progress library) on
#     the local Debian base (scripts/build-base-image.sh), its wheels fetched with this checkout's pip.
# Each is tagged with a hash of what it is made of, so a change to sim/ or progress/ makes a new one (the older
# archive is removed). Prints one line per image: `<image reference> <archive path>`, pause first.
# Cold: about 3 min on 2 cores (torch's wheel is 190 MB); cached: a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${NIGHTSHIFT_CACHE:-$HOME/.cache/nightshift}
PIP=${PIP:-.venv/bin/pip}
for tool in buildah podman rsync; do
  command -v "$tool" >/dev/null || { echo "$tool not found: run make deps" >&2; exit 1; }
done
[ -x "$PIP" ] || { echo "$PIP not found: run make deps" >&2; exit 1; }
mkdir -p "$CACHE"

# save REF ARCHIVE: the image as an OCI archive (a tar of an OCI layout) with uncompressed layers.
save() {
  local dir; dir=$(mktemp -d "${TMPDIR:-/tmp}/oci.XXXXXX")
  podman save --quiet --format oci-dir --uncompressed -o "$dir/layout" "$1" >&2
  tar -C "$dir/layout" -cf "$2.tmp" . && mv "$2.tmp" "$2"
  rm -rf "$dir"
}

PAUSE_BIN=$(scripts/build-kubernetes.sh pause)
PAUSE_KEY=$(sha256sum "$PAUSE_BIN" | cut -c1-16)
PAUSE_REF="localhost/nightshift-pause:$PAUSE_KEY"
PAUSE_TAR="$CACHE/pause-image-$PAUSE_KEY.tar"
if [ ! -s "$PAUSE_TAR" ]; then
  c=$(buildah from scratch)
  buildah copy -q "$c" "$PAUSE_BIN" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  buildah commit -q "$c" "$PAUSE_REF" >/dev/null
  buildah rm "$c" >/dev/null
  save "$PAUSE_REF" "$PAUSE_TAR"
fi
echo "$PAUSE_REF $PAUSE_TAR"

# The trainer: the same torch as this checkout's virtualenv (pinned by scripts/install-deps.sh).
TORCH_VERSION=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch").split("+")[0])')
BASE=$(scripts/build-base-image.sh)
PYTHON_VERSION=$(apt-cache show --no-all-versions python3 | sed -n 's/^Version: \([0-9]*\.[0-9]*\).*/\1/p' | head -1)
CTX=$(mktemp -d "${TMPDIR:-/tmp}/trainer-image.XXXXXX"); trap 'rm -rf "$CTX"' EXIT
rsync -a --exclude __pycache__ --exclude '*.egg-info' --exclude build sim progress "$CTX/"
cp docker/trainer.Dockerfile "$CTX/Dockerfile"
KEY=$( (cd "$CTX" && find . -type f -print0 | sort -z | xargs -0 sha256sum; echo "$BASE torch $TORCH_VERSION") \
  | sha256sum | cut -c1-16)
REF="localhost/nightshift-trainer:$KEY"
TAR="$CACHE/trainer-image-$KEY.tar"
if [ ! -s "$TAR" ]; then
  WHEELS="$CACHE/wheels-trainer-torch-$TORCH_VERSION-py$PYTHON_VERSION"
  if [ ! -f "$WHEELS/.complete" ]; then
    echo "fetching torch $TORCH_VERSION and its dependencies for Python $PYTHON_VERSION..." >&2
    "$PIP" download -q --dest "$WHEELS" --only-binary=:all: --python-version "$PYTHON_VERSION" \
      --platform manylinux_2_28_x86_64 "torch==$TORCH_VERSION" numpy prometheus-client setuptools >&2
    touch "$WHEELS/.complete"
  fi
  echo "building $REF (minutes)..." >&2
  buildah bud --quiet --isolation chroot --layers -v "$WHEELS:/wheels:ro" --build-arg "BASE_IMAGE=$BASE" \
    --build-arg "TORCH_VERSION=$TORCH_VERSION" -t "$REF" "$CTX" >&2
  find "$CACHE" -maxdepth 1 -name 'trainer-image-*.tar' ! -name "${TAR##*/}" -delete
  buildah images --format '{{.Name}}:{{.Tag}}' | grep -x 'localhost/nightshift-trainer:.*' | grep -vx "$REF" \
    | xargs -r buildah rmi >/dev/null 2>&1 || true
  save "$REF" "$TAR"
fi
echo "$REF $TAR"
