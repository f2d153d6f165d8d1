"""The epilog's reading of Slurm: the attempt's state, its output path, its part of the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sibylla.scheduler.epilog import OutputCursor, derive_state, expand_path, read_part
from sibylla.scheduler.scontrol import parse_job

# `scontrol show job -o` as slurmctld printed it inside EpilogSlurmctld (Slurm 22.05).
SHOW_JOB = ("JobId=7 JobName=train UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A "
            "JobState=COMPLETING Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 "
            "ExitCode=3:0 AllocNode:Sid=login1:3556 ExcNodeList=(null) NodeList= "
            "TRES=cpu=8,mem=64G,node=2,billing=8,gres/gpu=8 Command=/home/alice/run.sh "
            "WorkDir=/home/alice StdErr=/home/alice/out/train-7.out StdIn=/dev/null "
            "StdOut=/home/alice/out/train-7.out Power=")


def test_scontrol_fields_are_parsed_with_values_that_hold_equals_signs() -> None:
    job = parse_job(SHOW_JOB)
    assert job["TRES"] == "cpu=8,mem=64G,node=2,billing=8,gres/gpu=8"
    assert job["AllocNode:Sid"] == "login1:3556"
    assert (job["JobState"], job["Restarts"], job["NodeList"]) == ("COMPLETING", "0", "")
    assert job["StdOut"] == "/home/alice/out/train-7.out"


@pytest.mark.parametrize("attempt, code2, fields, expected", [
    (0, "3:0", {"Reason": "NonZeroExitCode"}, ("FAILED", 3, 0)),
    (0, "0:0", {"Reason": "None"}, ("COMPLETED", 0, 0)),
    # slurmctld requeued the job itself: its node failed (EXIT_CODE2 says nothing).
    (0, "0:0", {"Reason": "None", "Restarts": "1"}, ("NODE_FAIL", 0, 0)),
    (2, "0:0", {"Reason": "TimeLimit", "Restarts": "2"}, ("TIMEOUT", 0, 0)),
    (0, "0:125", {"Reason": "OutOfMemory"}, ("OUT_OF_MEMORY", 0, 125)),
    (0, "0:15", {"Reason": "None"}, ("CANCELLED", 0, 15)),
    (0, "0:9", {"Reason": "None"}, ("FAILED", 0, 9)),
    (0, "0:0", {"JobState": "NODE_FAIL", "Reason": "None"}, ("NODE_FAIL", 0, 0)),
])
def test_the_state_comes_from_scontrol_since_the_epilog_has_no_state_variable(
        attempt: int, code2: str, fields: dict[str, str], expected: tuple[str, int, int]
) -> None:
    job = {**parse_job(SHOW_JOB), **fields}
    assert derive_state(attempt, code2, job) == expected


def test_without_scontrol_the_exit_code_decides() -> None:
    assert derive_state(0, "1:0", None) == ("FAILED", 1, 0)
    assert derive_state(0, "", None) == ("COMPLETED", 0, 0)


def test_output_patterns_are_expanded_like_sbatch_does() -> None:
    job = parse_job(SHOW_JOB)
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "train", "SLURM_JOB_USER": "alice",
           "SLURM_JOB_WORK_DIR": "/scratch/alice"}
    assert expand_path("logs/%x-%j.out", job, env, "gpu01") == "/scratch/alice/logs/train-7.out"
    assert (expand_path("/o/%u/%N/%5j-100%%.log", job, env, "gpu01")
            == "/o/alice/gpu01/00007-100%.log")


def test_an_appended_output_ships_only_the_new_attempt(tmp_path: Path) -> None:
    out = tmp_path / "train-7.out"
    cursor = OutputCursor(tmp_path / "state", "7", "stdout")
    out.write_text("attempt 0 starts\nRuntimeError: NCCL error\n")
    lines, end = read_part(out, cursor.start(out), 1 << 20, 1000)
    assert lines == ["attempt 0 starts", "RuntimeError: NCCL error"]
    cursor.save(out, end)
    with out.open("a") as f:
        f.write("attempt 1 starts\nValueError: bad config\n")
    lines, end = read_part(out, cursor.start(out), 1 << 20, 1000)
    assert lines == ["attempt 1 starts", "ValueError: bad config"]
    cursor.save(out, end)
    # Without --open-mode=append the next attempt truncates and rewrites the file.
    out.write_text("attempt 2 starts again from scratch and prints much more than before\n"
                   "KeyError: 'lr'\n")
    lines, _ = read_part(out, cursor.start(out), 1 << 20, 1000)
    assert lines[-1] == "KeyError: 'lr'" and lines[0].startswith("attempt 2")


def test_an_output_rewritten_with_the_same_bytes_ships_again(tmp_path: Path) -> None:
    # Without --open-mode=append each attempt truncates the file, and a deterministic failure
    # prints the same log every time: same size, same bytes. Shipped as "nothing new", the
    # attempt was decided on an empty window (the site's default, not the model's verdict).
    out = tmp_path / "train-8.out"
    cursor = OutputCursor(tmp_path / "state", "8", "stdout")
    log = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'apex'\n"
    out.write_text(log)
    lines, end = read_part(out, cursor.start(out), 1 << 20, 1000)
    cursor.save(out, end)
    written = out.stat().st_mtime_ns
    out.write_text(log)  # the requeued attempt, truncating and printing the same
    os.utime(out, ns=(written + 10**9, written + 10**9))  # whatever the clock's resolution
    assert read_part(out, cursor.start(out), 1 << 20, 1000)[0] == lines
    cursor.save(out, end)
    # With --open-mode=append, an attempt that printed nothing leaves the file as it was.
    assert read_part(out, cursor.start(out), 1 << 20, 1000)[0] == []


def test_a_huge_output_ships_its_head_and_tail_and_long_lines_are_cut(tmp_path: Path) -> None:
    out = tmp_path / "big.out"
    body = "".join(f"step {i} loss 1.0\n" for i in range(100_000))
    out.write_text("Traceback (most recent call last):\n" + "x" * 5000 + "\n" + body
                   + "RuntimeError: died at the end\n")
    lines, end = read_part(out, 0, 64 * 1024, 1000)
    assert end == out.stat().st_size
    assert lines[0] == "Traceback (most recent call last):"
    assert len(lines[1]) == 1000
    assert lines[-1] == "RuntimeError: died at the end"
    assert sum(len(line) + 1 for line in lines) <= 64 * 1024
