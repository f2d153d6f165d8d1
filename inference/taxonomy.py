"""The failure taxonomy (see inference/data/README.md): categories and the verdict each implies.

Kept as data in one place so that the generator, the models, the baselines and the evaluation
agree on the label set and its order (the order is the category head's output order, so it is
part of the checkpoint format: append, never reorder).
"""

from __future__ import annotations

__all__ = [
    "CATEGORIES",
    "DETERMINISTIC",
    "LABELS",
    "NONDETERMINISTIC",
    "label_of",
]

DETERMINISTIC = (
    "syntax_error",
    "python_runtime_error",
    "import_error",
    "shape_dtype_device_mismatch",
    "config_error",
    "missing_file_or_permission",
    "gpu_out_of_memory",
    "framework_api_misuse",
    "numerical_error",
)
NONDETERMINISTIC = (
    "collective_timeout",
    "nccl_network_error",
    "connection_error",
    "gpu_hardware_error",
    "node_failure_or_preemption",
    "filesystem_io_error",
    "remote_service_error",
)
CATEGORIES = DETERMINISTIC + NONDETERMINISTIC
# Verdict head output order: index 0 is "deterministic".
LABELS = ("deterministic", "nondeterministic")


def label_of(category: str) -> str:
    """The verdict a category implies (``KeyError`` for a category outside the taxonomy)."""
    if category in DETERMINISTIC:
        return "deterministic"
    if category in NONDETERMINISTIC:
        return "nondeterministic"
    raise KeyError(category)
