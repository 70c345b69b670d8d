"""Speculative decoding: proposers (n-gram prompt lookup, a draft model) and the rejection sampler.

`config` is torch-free (the CLI parser reads it); the other modules import torch only where they
touch tensors.
"""
