"""First-stage retrievers (``retrieval.method``), one module each.

A retriever module defines a class following
:class:`rag_ablate.pipeline.stages.Retriever` and registers it with
``@RETRIEVERS.register("<name>")``; ``conf/retrieval/<name>.yaml`` makes it a
config option. The module is found on disk, so nothing else lists it.
"""
