"""Image tiles: encoded on a worker thread, their embeddings kept by content key."""
