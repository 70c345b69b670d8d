"""Engine flag mapping, flag catalogues and rendering of launch files and Kubernetes manifests."""

from llmdeploy.render.engine_command import EngineCommand, SecretEnv, engine_command
from llmdeploy.render.flag_catalogue import check_flags

__all__ = ["EngineCommand", "SecretEnv", "check_flags", "engine_command"]
