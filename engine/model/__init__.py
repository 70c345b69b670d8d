"""The decoder model, its tensor-parallel layers, quantized-layer construction, the CPU weight packs
and the sampler (built on kernels/ and parallel/).
"""
