"""PNG plots for the two commands; matplotlib is imported here only, and only when plotting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sibylla.simulator.metrics import PolicyMetrics

__all__ = ["plot_ettr", "plot_gpu_hours", "plot_jct_cdf", "plot_mttf"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(ax: Any, labels: tuple[str, str, str]) -> None:
    """Label the axes (x, y, title) and add the grid and legend."""
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(labels[2])
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


def _save(fig: Any, ax: Any, labels: tuple[str, str, str], path: Path) -> Path:
    """Label ``ax`` (x, y, title) and write the figure as a PNG."""
    if ax is not None:
        _label(ax, labels)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    _pyplot().close(fig)
    return path


def plot_gpu_hours(rows: Sequence[PolicyMetrics], path: Path) -> Path:
    """GPU-hours on futile retries and on all failed attempts, by policy."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r.failed_gpu_h for r in rows], 0.4, label="all failed attempts")
    ax.bar(x + 0.2, [r.futile_retry_gpu_h for r in rows], 0.4, label="futile retries")
    ax.set_xticks(x, [r.policy for r in rows])
    return _save(fig, ax, ("", "GPU-hours", "GPU time lost to failures, by retry policy"), path)


def plot_jct_cdf(jct_by_policy: Mapping[str, np.ndarray], failing: np.ndarray, path: Path) -> Path:
    """Empirical CDF of job completion time (log scale) for all jobs and for failing jobs.

    Most jobs never fail and finish alike under every policy, so the right-hand panel keeps
    only the jobs whose first attempt failed, where the policies differ.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    panels = (("all jobs", np.ones_like(failing, dtype=bool)), ("failing jobs", failing))
    for ax, (title, mask) in zip(axes, panels, strict=True):
        for name, jct in jct_by_policy.items():
            values = np.sort(np.maximum(jct[mask], 1e-3))
            ax.plot(values, np.arange(1, values.size + 1) / values.size, label=name)
        ax.set_xscale("log")
        _label(ax, ("job completion time (hours)", "fraction of jobs", f"JCT CDF, {title}"))
    return _save(fig, None, ("", "", ""), path)


def plot_mttf(
    gpus: Sequence[int],
    mttf_h: Sequence[float],
    published: Mapping[int, float],
    label: str,
    path: Path,
) -> Path:
    """MTTF against job size, log-log, with the published points marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.loglog(gpus, mttf_h, marker="o", label=label)
    if published:
        ax.scatter(
            list(published),
            list(published.values()),
            marker="x",
            s=80,
            color="red",
            zorder=3,
            label="published (Kokolis et al.)",
        )
    labels = ("GPUs in the job", "MTTF (hours)", "Mean time to failure vs job size")
    return _save(fig, ax, labels, path)


def plot_ettr(
    intervals_h: Sequence[float],
    curves: Mapping[str, Sequence[float]],
    monte_carlo: tuple[Sequence[float], Sequence[float], Sequence[float]],
    optimum: tuple[float, float],
    title: str,
    path: Path,
) -> Path:
    """ETTR against checkpoint interval: model curves, Monte Carlo points, optimum marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    minutes = np.asarray(intervals_h) * 60
    for name, values in curves.items():
        ax.plot(minutes, values, label=name)
    mc_x, mc_y, mc_err = monte_carlo
    ax.errorbar(
        np.asarray(mc_x) * 60,
        mc_y,
        yerr=np.asarray(mc_err) * 2,
        fmt="o",
        ms=4,
        label="Monte Carlo (±2 s.e.)",
    )
    ax.axvline(optimum[0] * 60, color="grey", ls="--")
    ax.scatter(
        [optimum[0] * 60],
        [optimum[1]],
        marker="*",
        s=150,
        color="red",
        zorder=3,
        label=f"optimum {optimum[0] * 60:.0f} min, ETTR {optimum[1]:.3f}",
    )
    ax.set_xscale("log")
    return _save(fig, ax, ("checkpoint interval (minutes)", "ETTR", title), path)
