"""Runners: the interface the engine calls (interface.Runner), the model runner, CUDA graphs,
decode windows on the device, tensor parallelism.
"""
