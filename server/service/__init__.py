"""The asyncio bridge: the only door from the API to the engine."""
