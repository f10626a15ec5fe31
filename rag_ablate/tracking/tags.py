"""The MLflow tag names this package reads and writes, defined once."""

from __future__ import annotations

PARENT_TAG = "mlflow.parentRunId"

NOTE_TAG = "mlflow.note.content"  # the run description the MLflow UI shows and edits

VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # experiment tags the UI reads for ?viewStateShareKey=

VIEW_KEY_TAG = "rag_ablate.ui_view"  # on a sweep run: the share key of its view

UI_PORT_TAG = "rag_ablate.ui_port"  # on a sweep run: the port its printed links use (tracking.ui_port)
