# The training image of the real-kubelet tests: sim.torch_trainer (a real torch.distributed job over gloo, CPU) with
# the progress library, as a cluster's training image would carry them. scripts/build-node-images.sh builds it with
# buildah (no registry is reachable here: the wheels come in through a build-time volume at /wheels, and BASE_IMAGE
# is the local Debian base of scripts/build-base-image.sh):
#
#   buildah bud --isolation chroot --layers -v WHEELS:/wheels:ro --build-arg BASE_IMAGE=... \
#     --build-arg TORCH_VERSION=2.13.0 -f docker/trainer.Dockerfile .
#
# WHEELS holds torch's CPU wheel and its dependencies for the base's Python (pip download); nothing else is fetched.
# numpy: torch.distributed.checkpoint gathers its plan with gather_object, which needs it ("Numpy is not available").
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
ARG TORCH_VERSION
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/trainer \
 && /opt/trainer/bin/pip install --no-index --find-links /wheels "torch==${TORCH_VERSION}" numpy prometheus-client
COPY progress /src/progress
RUN /opt/trainer/bin/pip install --no-index --find-links /wheels --no-deps /src/progress && rm -rf /src
COPY sim /opt/trainer-app/sim
ENV PATH=/opt/trainer/bin:$PATH PYTHONPATH=/opt/trainer-app PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /opt/trainer-app
USER 10001:10001
ENTRYPOINT ["/opt/trainer/bin/python", "-m", "sim.torch_trainer"]
