"""OpenAI's endpoints: chat completions, completions, embeddings, the Responses API."""
