# ccltune image: operator (`kopf run -m ccltune.controller...`), node agent (`ccltune-agent`) and
# the plan Job runner (`ccltune`). One image so the three always agree on the API models.
#   docker build -t ghcr.io/ccltune/ccltune:0.1.0 .
# The base is pinned to an exact patch release; CI may pin its digest on top
# (python:3.11.14-slim-bookworm@sha256:...) when it pushes.

# ccltune's NCCL tuner plugin (nccl-plugin/): C11 and libc only, so Debian's gcc suffices (no
# CUDA). The webhook's init container copies it from /opt/ccltune/nccl into training pods.
FROM python:3.11.14-slim-bookworm AS plugin
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY nccl-plugin ./nccl-plugin
RUN make -C nccl-plugin OUT=/out

FROM python:3.11.14-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY agent ./agent
# A plain (non-editable) install into a venv that the runtime stage copies whole.
# nvidia-ml-py (the agent's NVML binding) is a core dependency; libnvidia-ml itself is
# injected at run time by the NVIDIA container toolkit (NVIDIA_DRIVER_CAPABILITIES=utility).
RUN python -m venv /opt/ccltune \
 && /opt/ccltune/bin/pip install --no-compile . \
 && /opt/ccltune/bin/python -m compileall -q /opt/ccltune/lib

FROM python:3.11.14-slim-bookworm
LABEL org.opencontainers.image.title="ccltune" \
      org.opencontainers.image.description="Synthesize and tune NCCL/MSCCL collectives for the cluster a job runs on" \
      org.opencontainers.image.source="https://github.com/ccltune/ccltune" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/ccltune /opt/ccltune
COPY --from=plugin /out/libccltune-tuner.so /opt/ccltune/nccl/libccltune-tuner.so
ENV PATH=/opt/ccltune/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Numeric non-root user: the kubelet can only enforce runAsNonRoot against a numeric USER.
# 65532 matches the chart's podSecurityContext (the agent DaemonSet runs as 65534, also fine).
USER 65532:65532
WORKDIR /tmp
# No ENTRYPOINT: the chart and the operator set the command per role (kopf, ccltune-agent,
# ccltune).
CMD ["ccltune", "--help"]
