# vllm-guard layered onto the official vLLM OpenAI image.
#
#   docker build -t vllm-guard:0.1.0 .
#   docker build --build-arg VLLM_IMAGE=vllm/vllm-openai:<tag> -t vllm-guard:0.1.0-<tag> .
#
#   docker run --gpus all --ipc=host --stop-timeout 45 \
#     -p 8000:8000 -p 127.0.0.1:8077:8077 \
#     -e VLLM_GUARD_TOKEN="$(openssl rand -hex 32)" -e HF_TOKEN \
#     -v vllm-guard-state:/var/lib/vllm-guard \
#     -v ~/.cache/huggingface:/root/.cache/huggingface \
#     vllm-guard:0.1.0 meta-llama/Llama-3.1-8B-Instruct --max-model-len 32768
#
# Everything after the image name is `vllm serve`'s command line, unchanged (`vllm-guard serve`):
# the model, then vLLM's own flags. The guard's settings are VLLM_GUARD_* variables
# (-e VLLM_GUARD_REMEDIES_MIN_MODEL_LEN=8192 -e VLLM_GUARD_MAX_LAUNCHES=3 ...). The status endpoint
# listens on 0.0.0.0 here, so the guard refuses to start without a token of your own
# (VLLM_GUARD_TOKEN, 16 characters or more).
# --stop-timeout: Docker's default of 10 s is shorter than the guard's own stop grace (20 s).
# See docs/kubernetes.md.

# A released vLLM image: the newest vLLM whose rules and options the guard knows (core/vllm.py's
# NEWEST; a test holds the two together). The guard reads vLLM's version and adapts to any other tag.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.34.0
FROM ${VLLM_IMAGE}

LABEL org.opencontainers.image.title="vllm-guard" \
      org.opencontainers.image.description="vLLM's OpenAI server, supervised by vllm-guard" \
      org.opencontainers.image.licenses="Apache-2.0"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# tini as PID 1: it reaps whatever gets orphaned in the container and hands SIGTERM to the
# guard, which then stops vLLM's process group itself (SIGTERM, SIGKILL after stop_grace).
# Not pinned: the version is whatever the base image's Ubuntu release ships.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*

# The guard gets its own venv: its import name `supervisor` collides with supervisord's, and
# the image's python (vLLM, torch, CUDA wheels) must stay exactly as the vLLM image built it.
# vLLM is still found as `vllm` on PATH; the venv's bin is deliberately not on PATH.
COPY . /tmp/vllm-guard-src
RUN python3 -m venv /opt/vllm-guard \
 && /opt/vllm-guard/bin/pip install --no-cache-dir /tmp/vllm-guard-src \
 && rm -rf /tmp/vllm-guard-src \
 && ln -s /opt/vllm-guard/bin/vllm-guard /usr/local/bin/vllm-guard \
 && vllm-guard --version \
 && install -d -m 0700 /var/lib/vllm-guard

# Defaults for a container; each is overridden by `-e VLLM_GUARD_...` or by the same option
# on the command line. The state dir holds the token file, guard.json and the learned flags.
ENV VLLM_GUARD_HOST=0.0.0.0 \
    VLLM_GUARD_PORT=8000 \
    VLLM_GUARD_STATUS_HOST=0.0.0.0 \
    VLLM_GUARD_STATUS_PORT=8077 \
    VLLM_GUARD_STATE_DIR=/var/lib/vllm-guard \
    PYTHONUNBUFFERED=1

# Keep it on a named volume (or a PVC): learned flags then survive the container.
VOLUME ["/var/lib/vllm-guard"]

# 8000: vLLM's OpenAI API. 8077: the guard's /healthz, /ready, /status, /metrics.
EXPOSE 8000 8077

# Healthy means vLLM serves (the guard's /ready: a chat completion answers), so compose's
# `depends_on: condition: service_healthy` waits for a model that answers. Loads take minutes:
# the start period covers a large one. While the guard heals vLLM it is unhealthy, which is the
# truth; restarting vLLM is the guard's job (its own liveness is /healthz, for Kubernetes).
# Uses the guard's python, so the image needs no curl.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20m --retries=3 \
    CMD ["/opt/vllm-guard/bin/python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('VLLM_GUARD_STATUS_PORT', '8077') + '/ready', timeout=4)"]

STOPSIGNAL SIGTERM

ENTRYPOINT ["/usr/bin/tini", "--", "/opt/vllm-guard/bin/vllm-guard", "serve"]
CMD []
