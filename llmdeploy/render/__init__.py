"""Engine flag mapping, flag catalogues and the launch files and Kubernetes manifests targets render.

The `render` stage itself is `llmdeploy.targets.render`: the recipe's target picks what is rendered.
"""

from llmdeploy.engines.catalogue import check_flags
from llmdeploy.render.artifacts import Artifacts
from llmdeploy.render.engine_command import EngineCommand, SecretEnv, engine_command

__all__ = ["Artifacts", "EngineCommand", "SecretEnv", "check_flags", "engine_command"]
