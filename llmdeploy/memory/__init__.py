"""Engine-neutral building blocks of the memory model: the inputs a plan reads (`PlanInputs`), the
plan itself (`MemoryPlan`), weights / activation / KV-layout / CUDA-graph footprints and the
built-in engine's allocator rule.

Layer: above `catalog` (and `recipe`, read only for types), below `engines`: each engine's memory
rule in `llmdeploy/engines/` assembles a plan from these, and `planner` (make_plan, fit, accuracy)
asks the engine. Nothing here imports `engines` or `planner`.
"""
