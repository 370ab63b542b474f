"""Anthropic's Messages API, as a translation onto the chat path."""
