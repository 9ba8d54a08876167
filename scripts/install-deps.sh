#!/usr/bin/env bash
# Install what Nightshift's tests and demo need on a fresh Debian/Ubuntu machine; idempotent and quick when present.
#   system: Prometheus, Alertmanager, promtool/amtool, Slurm (slurmctld, slurmd, client) + munge, OpenSSH server,
#           etcd + Go + gcc (for the kube-apiserver, kubelet, scheduler, controller-manager and pause built from
#           Debian's source), containerd + runc + CNI plugins + iproute2 (the real kubelet's nodes), PostgreSQL 15,
#           Chromium for browser tests, buildah/podman/mmdebstrap (the container images, docs/deploy.md).
#           sudo (the least-privilege Slurm account's sudoers, deploy/slurm/).
#   python: a virtualenv in .venv with the package and its dev extras, and the progress library (progress/);
#           PyTorch's CPU build (the simulator's real torch.distributed jobs, sim/torch_trainer.py), pinned: an
#           unpinned torch would pull the multi-GB CUDA build. pip caches the wheel (~/.cache/pip) across venvs.
set -euo pipefail
cd "$(dirname "$0")/.."
want=(prometheus prometheus-alertmanager slurmctld slurmd slurm-client munge openssh-server etcd-server golang-go
      gcc libc6-dev rsync postgresql wrk chromium chromium-driver buildah podman mmdebstrap uidmap fuse-overlayfs sudo
      containerd runc containernetworking-plugins iproute2)
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev]' -e ./progress
  rm -f .venv/.installed-*; touch "$stamp"
fi
# PyTorch, pinned (the CPU build: +cpu has no CUDA libraries), in a step of its own: its wheel is 192 MB. Then the
# frameworks of the simulator's Trainer variants (sim/hf_trainer.py needs accelerate; sim/lightning_trainer.py), pinned
# to versions whose torch requirement the pinned torch meets, so pip never replaces it.
TORCH_VERSION=2.13.0
FRAMEWORKS=(accelerate==1.16.0 lightning==2.6.6)
torch_stamp=.venv/.torch-$(echo "$TORCH_VERSION ${FRAMEWORKS[*]}" | sha1sum | cut -c1-12)
if [ ! -f "$torch_stamp" ]; then
  .venv/bin/pip install -q "torch==$TORCH_VERSION" "${FRAMEWORKS[@]}"
  .venv/bin/python -c "import torch, sys; sys.exit(not torch.__version__.startswith('$TORCH_VERSION'))"
  rm -f .venv/.torch-*; touch "$torch_stamp"
fi
