"""Runners: the model runner, CUDA graphs, decode windows on the device, tensor-parallel workers;
each implements core.runner_interface.Runner, the one interface the engine calls.
"""
