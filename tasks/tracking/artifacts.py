"""The artifacts of a tracked run: texts, dicts, tables, figures, directories, and saved views of
an experiment's runs table. ``ArtifactLog`` is the part of ``tasks.tracking.tracker.Tracker``
that writes them; like every tracker call, each goes through the tracker's guard, so a failed
write warns and the run goes on.
"""

from __future__ import annotations

import io
import json
import math
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tasks.tracking.store import ui_url

# MLflow (3.15+) keeps a saved view of an experiment's runs table (columns, filter, order) as an
# experiment tag with this prefix; the UI lists it under Views and opens it from a share link.
SAVED_VIEW_TAG = "mlflow.sharedViewState."


class ArtifactLog:
    """Artifact writing for a tracker: it needs the tracker's ``active``, ``client``, ``run_id``,
    ``uri``, ``_experiment_id()`` and ``_guard(what, fn)``."""

    active: bool
    client: Any
    run_id: str | None
    uri: str
    _experiment_id: Callable[[], str]
    _guard: Callable[[str, Callable[[], Any]], Any]

    def log_text(self, text: str, artifact_file: str) -> None:
        if self.active:
            self._guard(
                f"logging {artifact_file}",
                lambda: self.client.log_text(self.run_id, text, artifact_file),
            )

    def log_dict(self, data: Mapping[str, Any], artifact_file: str) -> None:
        self.log_text(json.dumps(data, indent=2, default=str), artifact_file)

    def log_frame(self, frame: Any, artifact_file: str) -> None:
        """A pandas DataFrame as a CSV artifact (``.csv``) or a markdown one (``.md``)."""
        if artifact_file.endswith(".md"):
            self.log_text(markdown_table(frame), artifact_file)
        else:
            buf = io.StringIO()
            frame.to_csv(buf, index=False)
            self.log_text(buf.getvalue(), artifact_file)

    def log_table(self, rows: list[Mapping[str, Any]], artifact_file: str) -> None:
        """Rows (e.g. sample generations) as an MLflow table, shown in the UI's artifact view."""
        if not self.active or not rows:
            return
        import pandas as pd

        frame = pd.DataFrame([dict(r) for r in rows])

        def write() -> None:
            with warnings.catch_warnings():  # MLflow's own pandas-3 deprecation warning
                warnings.simplefilter("ignore", FutureWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
                self.client.log_table(self.run_id, frame, artifact_file)

        self._guard(f"logging {artifact_file}", write)

    def run_url(self) -> str | None:
        """The run's page in the MLflow UI (training view), or None when not tracked."""
        if not self.active or not self.run_id:
            return None
        return self._guard(
            "reading the experiment", lambda: ui_url(self.uri, self._experiment_id(), self.run_id)
        )

    def save_runs_view(self, view_id: str, name: str, state: Mapping[str, Any]) -> str | None:
        """Save a view of the experiment's runs table (``state``: the UI's view state, e.g.
        ``selectedColumns`` and ``searchFilter``) under ``name``; returns the UI address that opens
        it (in the training view), or None when tracking is off or failed."""
        if not self.active:
            return None
        now = int(time.time() * 1000)
        envelope = {"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}

        def write() -> str:
            experiment_id = self._experiment_id()
            self.client.set_experiment_tag(
                experiment_id, SAVED_VIEW_TAG + view_id, json.dumps(envelope)
            )
            return ui_url(self.uri, experiment_id, viewStateShareKey=view_id)

        return self._guard(f"saving the runs view {name!r}", write)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        if self.active:
            self._guard(
                f"logging {artifact_file}",
                lambda: self.client.log_figure(self.run_id, figure, artifact_file),
            )

    def log_artifacts(self, local_dir: Path, artifact_path: str | None = None) -> None:
        if self.active and Path(local_dir).is_dir():
            self._guard(
                f"logging {local_dir}",
                lambda: self.client.log_artifacts(self.run_id, str(local_dir), artifact_path),
            )


def markdown_table(frame: Any) -> str:
    """A DataFrame as a GitHub markdown table (no ``tabulate`` dependency)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.4g}"
        return str(v).replace("|", "\\|")

    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"
