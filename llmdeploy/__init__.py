"""llmdeploy: declarative LLM serving.

recipe (YAML) -> Recipe -> MemoryPlan -> Artifacts -> running endpoint -> Report.
The toolkit never imports torch; the built-in engine lives in `llmdeploy_engine` (folder `engine/`).
"""

__version__ = "0.1.0"
