"""The batching core: scheduling, KV block accounting, sequences, stop checks and request
bookkeeping. Plain Python; never imports torch (tests/engine_core/test_core_no_torch.py).
"""
