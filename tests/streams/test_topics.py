"""The changelogs Sibylla creates before a worker starts cover every table it uses."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from sibylla.settings import Settings
from sibylla.streams.topics import TABLES
from sibylla.streams.worker import build_worker


def test_every_table_of_a_worker_has_its_changelog_created_up_front(tmp_path: Path) -> None:
    """A table missing from TABLES would have its changelog created by faust at start, which
    raced the broker's metadata (PartitionsMismatch: the agent writing to it stopped)."""
    settings = Settings.from_env({}, store="memory", data_dir=str(tmp_path))
    classifier = SimpleNamespace(version="v0", predict=lambda windows: [])
    app = build_worker(settings, classifier).t.app
    assert set(app.tables.keys()) == set(TABLES)
