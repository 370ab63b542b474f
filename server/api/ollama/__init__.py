"""Ollama's HTTP API (/api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags,
/api/show, /api/ps, /api/version) as translations onto ggserve's chat, completion and
embedding paths; errors in Ollama's shape `{"error": "..."}`."""
