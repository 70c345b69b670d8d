# llmdeploy's built-in engine on NVIDIA GPUs. Build from the repository root (docs/docker.md):
#   python3 -m pip wheel --no-deps -w dist .
#   docker build -f docker/engine.Dockerfile -t llmdeploy/engine:0.1.0 .
# Renders of `engine: {type: builtin}` recipes name this tag unless target.image says otherwise.
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04

# Triton compiles a small C launcher per kernel at run time: it needs a C compiler and Python's headers.
RUN apt-get update \
 && apt-get install --yes --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/llmdeploy
ENV PATH=/opt/llmdeploy/bin:$PATH

# The install lines below are the ones tests/test_packaging.py runs in a clean venv (keep them
# identical in engine-cpu.Dockerfile; the test checks). torch is the PyPI build, which bundles CUDA.
COPY dist/llmdeploy-0.1.0-py3-none-any.whl /tmp/dist/
RUN python3 -m pip install --no-cache-dir "torch==2.13.0" "/tmp/dist/llmdeploy-0.1.0-py3-none-any.whl[engine]"
RUN rm -rf /tmp/dist

# Non-root, with the model cache as a volume; Kubernetes renders run it as this uid with a
# read-only root file system, HOME=/tmp and HF_HOME on the volume.
# (Ubuntu's images ship a user `ubuntu` with uid 1000: it makes way for `engine`)
RUN (userdel --remove ubuntu 2>/dev/null || true) \
 && useradd --uid 1000 --user-group --create-home --home-dir /home/engine engine \
 && mkdir -p /models && chown 1000:1000 /models
ENV HF_HOME=/models/huggingface
VOLUME ["/models"]
USER 1000
EXPOSE 8000
ENTRYPOINT ["llmdeploy-engine", "serve"]
