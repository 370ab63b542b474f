"""Chat formatting: prompts from messages, templates, tool-call and reasoning syntaxes, grammars, stops."""
