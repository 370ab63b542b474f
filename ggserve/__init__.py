"""ggserve: an OpenAI-compatible inference server for GGUF models on ggml."""

__version__ = "0.1.0"
