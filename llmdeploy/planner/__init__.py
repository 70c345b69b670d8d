"""The memory planner: per-GPU budget of a deployment for vLLM, TGI and the built-in engine."""

from llmdeploy.memory.memory_plan import MemoryPlan
from llmdeploy.memory.plan_inputs import PlanInputs
from llmdeploy.planner.plan import make_plan, plan_from_inputs

__all__ = ["MemoryPlan", "PlanInputs", "make_plan", "plan_from_inputs"]
