# llmdeploy's built-in engine on CPU (the quickstart's SmolLM2-135M and other small models). Build
# from the repository root (docs/docker.md):
#   python3 -m pip wheel --no-deps -w dist .
#   docker build -f docker/engine-cpu.Dockerfile -t llmdeploy/engine:0.1.0-cpu .
# Renders of builtin recipes with hardware.device: cpu name this tag unless target.image says otherwise.
# PyTorch's CPU-only wheels (far smaller than PyPI's CUDA build) come from PyTorch's own CPU wheel
# index: pass it as --build-arg PIP_EXTRA_INDEX_URL=...; without it PyPI's build is used, which also
# runs on CPU.
FROM python:3.11-slim

# The engine compiles its CPU integer dot-product kernels (engine/kernels/cpu_dot.c) at first start;
# without a C compiler it falls back to torch's kernels, at about half the decode speed.
RUN apt-get update \
 && apt-get install --yes --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
ARG PIP_EXTRA_INDEX_URL=
RUN python3 -m venv /opt/llmdeploy
ENV PATH=/opt/llmdeploy/bin:$PATH

# The install lines below are the ones tests/test_packaging.py runs in a clean venv (keep them
# identical in engine.Dockerfile; the test checks).
COPY dist/llmdeploy-0.1.0-py3-none-any.whl /tmp/dist/
RUN python3 -m pip install --no-cache-dir "torch==2.13.0" "/tmp/dist/llmdeploy-0.1.0-py3-none-any.whl[engine]"
RUN rm -rf /tmp/dist

# Non-root, with the model cache as a volume; Kubernetes renders run it as this uid with a
# read-only root file system, HOME=/tmp and HF_HOME on the volume.
RUN useradd --uid 1000 --user-group --create-home --home-dir /home/engine engine \
 && mkdir -p /models && chown 1000:1000 /models
ENV HF_HOME=/models/huggingface
VOLUME ["/models"]
USER 1000
EXPOSE 8000
ENTRYPOINT ["llmdeploy-engine", "serve"]
