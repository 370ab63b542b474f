"""Tokenizers built from GGUF metadata, exact to llama.cpp, and streaming detokenization."""
from .stream import StreamDecoder
from .tokenizer import Tokenizer
from .vocab import Attr, Vocab

__all__ = ["Attr", "StreamDecoder", "Tokenizer", "Vocab"]
