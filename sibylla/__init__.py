"""Sibylla: classifies failed deep-learning jobs as worth retrying or not, from their logs."""

__version__ = "0.1.0"
__all__ = ["__version__"]
