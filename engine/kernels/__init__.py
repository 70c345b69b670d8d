"""Triton kernels and the ops that pick them (and their CPU fallbacks)."""
