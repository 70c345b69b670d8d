"""Engine flag mapping, flag catalogues and rendering of launch files and Kubernetes manifests."""

from llmdeploy.engines.catalogue import check_flags
from llmdeploy.render.artifacts import Artifacts
from llmdeploy.render.engine_command import EngineCommand, SecretEnv, engine_command
from llmdeploy.render.renderer import render

__all__ = ["Artifacts", "EngineCommand", "SecretEnv", "check_flags", "engine_command", "render"]
