"""Checkpoints in: GGUF files, Hugging Face folders, quantized formats, random weights, tokenizers."""
