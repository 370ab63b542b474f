"""Tool-call syntaxes of the chat-template families and the grammars that force calls."""
