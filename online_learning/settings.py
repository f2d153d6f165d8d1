"""Settings of the online-learning loop, built from ``SIBYLLA_*`` variables like :class:`Settings`.

Kept apart from :class:`sibylla.settings.Settings` because only the worker's votes agent and the
trainer read them; parsing and bounds reuse the same strict helpers, so
``SIBYLLA_GATE_TOLERANCE=abc`` stops start-up with a line naming the setting. No
``from __future__ import annotations``: the parser reads the fields' real types.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sibylla.settings import check_fields, env_of, setting, values_from_env

if TYPE_CHECKING:
    from .votes import VoteRule

__all__ = ["OnlineSettings"]


@dataclass(frozen=True)
class OnlineSettings:
    """Vote rule, trainer schedule, promotion gate and model storage."""

    # --- votes (see online_learning/votes.py for the rule) ------------------------------------
    operator_weight: float = setting(10.0, "Weight of an operator's label.", min=0.0)
    outcome_weight: float = setting(2.0, "Weight of the retry-outcome vote.", min=0.0)
    committee_weight: float = setting(
        0.5, "Weight of one committee model's vote, times its confidence.", min=0.0)
    committee: str = setting(
        "", "Extra models voting beside the deciding one, comma-separated: rules, tfidf, or "
        "model file paths (see online_learning/committee.py).")
    label_min_weight: float = setting(
        1.5, "Weight the winning label's votes must sum to.", min=0.0)
    label_min_margin: float = setting(
        0.5, "Winning minus losing weight a label needs (ties never label).", min=0.0)

    votes_ttl_s: float = setting(
        7 * 24 * 3600.0, "Votes of an attempt are dropped this long after it failed.", min=1.0)

    # --- trainer ------------------------------------------------------------------------------
    models_dir: Path = setting(Path("sibylla-models"),
                                "Where the trainer writes promoted models and its index.")
    model_name: str = setting("sibylla-classifier", "Key of announcements on sibylla.models.")
    finetune_every: int = setting(200, "Fine-tune after this many new labels.", min=1)
    drift_min_labels: int = setting(
        50, "Fewest new labels a drift-triggered fine-tune waits for.", min=1)
    drift_threshold: float = setting(
        0.3, "Committee-vs-outcome disagreement rate that signals drift.", min=0.0, max=1.0)
    drift_window: int = setting(200, "Recent labels the disagreement rate is taken over.", min=1)
    replay_size: int = setting(2000, "Older examples kept for replay (per verdict class).",
                                min=1)
    replay_ratio: float = setting(
        2.0, "Replayed examples per new example in a fine-tune.", min=0.0)
    holdout_every: int = setting(
        5, "Every Nth label goes to the validation set and is never trained on.", min=2)
    holdout_size: int = setting(500, "Most recent held-back labels kept.", min=1)
    finetune_epochs: int = setting(8, "Epochs of one fine-tune.", min=1)
    finetune_lr: float = setting(3e-3, "Learning rate of a fine-tune.", min=0.0)
    gate_tolerance: float = setting(
        0.01, "A candidate may be this much less accurate than the current model.", min=0.0)
    gate_precision_tolerance: float = setting(
        0.01, "Allowed drop of deterministic precision (0: none at all).", min=0.0)
    trainer_metrics_port: int = setting(9466, "Port of the trainer's /metrics (0: none).",
                                         min=0, max=65535)

    # --- security (README "Security") ------------------------------------------------------
    model_signing_key: str = setting(
        "", "The trainer's Ed25519 private key file (PEM, mode 0600, from `sibylla models "
        "keygen`); it signs every announcement. Empty: announcements go out unsigned.")
    model_public_key: str = setting(
        "", "The trainer's public key (base64, as `sibylla models keygen` prints it); workers "
        "load only announcements it signed.")
    allow_unsigned_models: bool = setting(
        False, "Without a public key, load unsigned announcements anyway (a test bed only: "
        "whoever can write sibylla.models then chooses the model). Off: they are refused.")
    model_roots: str = setting(
        "", "Directories announced model files must lie in, comma-separated (symlinks and .. "
        "resolved first). Empty: the models directory.")
    operator_tokens_file: str = setting(
        "", "File of `name:token` lines (one per operator) a worker accepts as bearer tokens "
        "on POST /labels. Empty: operator labels over HTTP are disabled.")
    operator_token: str = setting(
        "", "The token `sibylla label` sends (prefer the variable to the flag).", secret=True)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "OnlineSettings":
        """Settings from ``SIBYLLA_*`` variables, then ``overrides`` (typed or str)."""
        return cls(**values_from_env(cls, env, overrides))

    def to_env(self) -> dict[str, str]:
        """``SIBYLLA_*`` variables that rebuild these settings in a worker's process."""
        return env_of(self)

    def roots(self) -> list[Path]:
        """The directories model files may be loaded from, resolved."""
        named = [Path(p.strip()) for p in self.model_roots.split(",") if p.strip()]
        return [p.resolve() for p in named or [self.models_dir]]

    def vote_rule(self) -> "VoteRule":
        """The majority rule these settings describe (see online_learning/votes.py)."""
        from .votes import VoteRule

        return VoteRule(operator_weight=self.operator_weight, outcome_weight=self.outcome_weight,
                        committee_weight=self.committee_weight,
                        min_weight=self.label_min_weight, min_margin=self.label_min_margin)

    def __post_init__(self) -> None:
        check_fields(self)
