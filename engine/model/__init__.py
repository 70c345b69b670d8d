"""The decoder model, its attention, tensor-parallel layers, KV cache and sampler."""
