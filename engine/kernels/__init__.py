"""Kernels and the ops that pick them: Triton kernels, their CPU fallbacks, paged attention with its
metadata, KV-cache storage formats and the quantized weight formats. Imports nothing above it but the
batching core's plain step description.
"""
