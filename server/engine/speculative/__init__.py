"""Speculative decoding: the drafts a decode step verifies."""
