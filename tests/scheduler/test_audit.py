"""The actuator's audit file under the ways logrotate rotates files."""

from __future__ import annotations

import os
from pathlib import Path

from sibylla.scheduler.audit import AuditFile


def test_lines_after_a_rename_rotation_go_to_the_new_file(tmp_path: Path) -> None:
    """logrotate's default renames the file: a writer that kept its descriptor appended to
    the rotated file, deleted at a later rotation with every line written since."""
    path = tmp_path / "audit.jsonl"
    audit = AuditFile(path)
    audit.write(b'{"job_id":"1"}\n')
    audit.flush()
    path.rename(tmp_path / "audit.jsonl.1")
    audit.write(b'{"job_id":"2"}\n')
    audit.flush()
    audit.close()
    assert (tmp_path / "audit.jsonl.1").read_bytes() == b'{"job_id":"1"}\n'
    assert path.read_bytes() == b'{"job_id":"2"}\n'


def test_a_removed_file_is_made_again_and_a_truncated_one_written_from_its_start(
        tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditFile(path)
    audit.write(b"a" * 100 + b"\n")
    audit.flush()
    os.truncate(path, 0)  # copytruncate: the same file, emptied
    audit.write(b"b\n")
    audit.flush()
    assert path.read_bytes() == b"b\n"  # appended at the new end, no hole before it
    path.unlink()
    audit.write(b"c\n")
    audit.flush()
    audit.close()
    assert path.read_bytes() == b"c\n"
