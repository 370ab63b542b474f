"""llama-server's native endpoints: /completion, /infill, /props, /slots, /rerank, the chat page."""
