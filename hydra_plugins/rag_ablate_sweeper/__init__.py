"""Hydra sweeper plugin of rag_ablate: one factor at a time (``hydra/sweeper=ablation``)."""
