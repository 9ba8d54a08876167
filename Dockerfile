# Nightshift's container image: `nightshift serve` as a non-root numeric user, state only under /var/lib/nightshift.
#
#   buildah bud --layers -t localhost/nightshift:0.1.0 .        (or: docker build -t nightshift:0.1.0 .)
#
# BASE_IMAGE: any Debian-like image with python3 (>= 3.11) and its venv module; the default is the public slim image.
# Both stages must use the same base: the runtime copies the build stage's virtualenv, interpreter path included.
# Probes (no HEALTHCHECK: the OCI image format has none): liveness GET /healthz, readiness GET /readyz on port 8080
# (charts/nightshift sets them; docs/deploy.md). tests/integration/test_image.py builds and runs this file.
ARG BASE_IMAGE=python:3.12-slim

# The runtime dependencies named in pyproject.toml, alone: the layers below are rebuilt only when they change
# (not when a development dependency or the version does).
FROM ${BASE_IMAGE} AS requirements
COPY pyproject.toml /src/
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > /requirements.txt

# The virtualenv has no pip: a second one's pip installs into it (pip --python). kubernetes.aio (the asyncio
# client, about half of the kubernetes package) is removed: app/clients/kube.py uses the synchronous one.
# Bytecode is compiled here because the root filesystem is read-only at run time. The application goes to its
# own directory, put on the path by a .pth file, so that a change to app/ leaves the dependencies' layer alone.
FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
COPY --from=requirements /requirements.txt /src/requirements.txt
RUN python3 -m venv /opt/pip \
 && python3 -m venv --without-pip /opt/nightshift \
 && /opt/pip/bin/pip --python /opt/nightshift/bin/python install --only-binary=:all: -r /src/requirements.txt \
 && rm -rf /opt/nightshift/lib/python3*/site-packages/kubernetes/aio \
 && echo /opt/nightshift-app > "$(/opt/nightshift/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/nightshift-app.pth" \
 && /opt/nightshift/bin/python -m compileall -q /opt/nightshift
COPY pyproject.toml README.md /src/
COPY app /src/app
RUN /opt/pip/bin/pip --python /opt/nightshift/bin/python install --no-deps --no-compile --target /opt/nightshift-app /src \
 && /opt/nightshift/bin/python -m compileall -q /opt/nightshift-app

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
# SOURCE: the repository URL (--build-arg SOURCE=https://...); empty unless given.
ARG SOURCE=""
LABEL org.opencontainers.image.title="nightshift" \
      org.opencontainers.image.description="Alertmanager webhooks to guarded, audited remediation of GPU training jobs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 nightshift \
 && useradd --uid 10001 --gid 10001 --home-dir /var/lib/nightshift --no-create-home \
      --shell /usr/sbin/nologin nightshift \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/nightshift
COPY --from=build /opt/nightshift /opt/nightshift
COPY --from=build /opt/nightshift-app /opt/nightshift-app
COPY playbooks /usr/share/nightshift/playbooks
COPY docker/settings.yaml /etc/nightshift/settings.yaml
ENV PATH=/opt/nightshift-app/bin:/opt/nightshift/bin:$PATH \
    NIGHTSHIFT_CONFIG=/etc/nightshift/settings.yaml \
    HOME=/var/lib/nightshift \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
VOLUME /var/lib/nightshift
WORKDIR /var/lib/nightshift
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/opt/nightshift-app/bin/nightshift"]
CMD ["serve", "--bind", "0.0.0.0:8080"]
