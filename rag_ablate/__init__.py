"""rag_ablate: declarative, statistically honest ablations for RAG systems."""

__version__ = "0.1.0"
