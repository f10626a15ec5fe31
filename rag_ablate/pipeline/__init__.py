"""The built-in local RAG pipeline: chunk, index, retrieve, route."""
