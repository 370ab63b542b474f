"""Token sampling with llama.cpp's sampler-chain semantics."""
