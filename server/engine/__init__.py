"""The engine: step plans run on a loaded model (no HTTP, no chat formatting)."""
