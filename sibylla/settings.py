"""All of Sibylla's configuration, in one frozen, typed object.

Every setting comes from a ``SIBYLLA_<NAME>`` environment variable or the matching
``--<name>`` flag (flags win). Values are parsed strictly (a number is a number, a choice one of
its choices, NaN is out of every range), and a bad value stops start-up with one line naming
the setting, so a typo in a deployment manifest is caught at once rather than as odd behaviour
hours later. :func:`setting`, :func:`values_from_env` and :func:`check_fields` are shared with
the online-learning settings (``online_learning/settings.py``).
"""

import argparse
import dataclasses
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

__all__ = ["CONNECTION", "Settings", "SettingsError", "add_settings_arguments", "check_bounds",
           "check_fields", "env_of", "parse_setting", "setting", "settings_from_args",
           "values_from_env"]

ENV_PREFIX = "SIBYLLA_"
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
StoreKind = Literal["rocksdb", "memory"]
DeviceChoice = Literal["auto", "cpu", "cuda"]


class SettingsError(ValueError):
    """A setting has a value Sibylla cannot use; the message names the setting."""


def setting(default: Any, help: str, **extra: Any) -> Any:
    """A settings field: its default, the help shown by ``--help``, bounds (``min``, ``max``)."""
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class Settings:
    """Runtime configuration. Build it with :meth:`from_env` or :func:`settings_from_args`."""

    # --- Kafka connection -------------------------------------------------------------------
    bootstrap_servers: str = setting(
        "", "Kafka bootstrap servers, host:port[,host:port]. Empty: the demo starts Tansu."
    )
    topic_prefix: str = setting("sibylla.", "Prefix of every Sibylla topic.")
    partitions: int = setting(4, "Partitions of sibylla.logs and sibylla.job-events.", min=1)
    replication_factor: int = setting(1, "Replication factor of topics Sibylla creates.", min=1)
    group_id: str = setting("", "Consumer group (faust app id) of the workers; its tables' "
                            "changelog topics are named after it. Empty: the topic prefix "
                            "without its trailing dot (sibylla).")
    security_protocol: SecurityProtocol = setting("PLAINTEXT", "Kafka security protocol.")
    sasl_mechanism: SaslMechanism = setting("PLAIN", "SASL mechanism when SASL is used.")
    sasl_username: str = setting("", "SASL user name.")
    sasl_password: str = setting("", "SASL password (never printed).", secret=True)
    ssl_cafile: str = setting("", "CA bundle for SSL.")
    ssl_certfile: str = setting("", "Client certificate for SSL.")
    ssl_keyfile: str = setting("", "Client key for SSL.")
    session_timeout_ms: int = setting(
        6000, "Consumer session timeout; a dead worker's partitions move after this.", min=1000
    )
    broker_wait_s: float = setting(
        120.0, "At start, how long a worker waits for an unreachable broker, or one that goes "
        "away during its topic check, before it exits (a broker restarting is not a reason to "
        "crash-loop).", min=0.0
    )

    # --- log windows --------------------------------------------------------------------------
    window_max_lines: int = setting(256, "Tail lines kept per job attempt.", min=1)
    window_max_bytes: int = setting(65536, "Tail bytes kept per job attempt.", min=256)
    first_error_max_lines: int = setting(
        48, "Lines kept of the first error block (the root cause).", min=0
    )
    max_line_bytes: int = setting(
        16384, "Longer lines are rejected to the dead-letter topic.", min=64
    )
    window_ttl_s: float = setting(
        7 * 24 * 3600.0, "Windows of jobs silent this long are dropped; decisions are "
        "remembered this long (replay protection, GET /decisions).", min=1.0
    )
    grace_period_s: float = setting(
        2.0, "After a failed job ends, wait this long for late log lines.", min=0.0
    )

    field_map: str = setting(
        "", "Where a shipper's native record keeps contract fields, e.g. "
        "'line=log,job_id=kubernetes.labels.job-name' (dotted paths)."
    )

    # --- inference ----------------------------------------------------------------------------
    batch_max_windows: int = setting(64, "Micro-batch size B for classification.", min=1)
    batch_max_wait_ms: float = setting(
        0.0, "Longest wait T for a micro-batch to fill; 0: a batch is what queued while the "
        "previous one ran (a lone failure is never held).", min=0.0
    )
    device: DeviceChoice = setting(
        "auto", "auto picks CUDA when present, else CPU. The model is small: on an H200 a "
        "decision took as long as on one CPU core, so cpu leaves the GPU to jobs."
    )
    cpu_threads: int = setting(
        1, "Threads of a forward pass on CPU. A worker's batches are small: a second thread "
        "gains little and takes a core from the event loop that feeds the model.", min=1
    )
    model_path: str = setting("", "Model file; empty means the model shipped in the package.")
    min_confidence: float = setting(
        0.0, "Below this confidence a deterministic verdict is unknown (a transient one is "
        "never withheld); 0 means the model's threshold.",
        min=0.0, max=1.0,
    )
    min_retry_confidence: float = setting(
        0.0, "A transient verdict below this confidence gets default_policy instead of retry "
        "or retry_elsewhere, for sites that do not retry failed jobs by default (0: every "
        "transient verdict is acted on; the model's threshold: as before session 26).",
        min=0.0, max=1.0,
    )
    explore_rate: float = setting(
        0.0, "Share of deterministic verdicts sent as default_policy instead of do_not_retry "
        "(marked explored), so the scheduler retries them and the retry's outcome votes in "
        "online learning. Costs that share of rightly stopped jobs one more failing run. "
        "0 turns exploration off.",
        min=0.0, max=1.0,
    )
    explore_max_confidence: float = setting(
        1.0, "Explore only deterministic verdicts at most this confident (1: all). The wrong "
        "ones are mostly the unsure ones, so e.g. 0.9 spends the explored retries where a "
        "verdict is likely wrong.",
        min=0.0, max=1.0,
    )

    # --- retry policy with memory (README: Retry policy) --------------------------------------
    policy_max_retries: int = setting(
        3, "Retries a job may use for failures that are its own (node failures are free); "
        "past it every failure is do_not_retry (rule retry_budget_spent).", min=0
    )
    policy_max_recurrence: int = setting(
        2, "Unsure verdicts: stop (do_not_retry, rule same_root_recurred) when the same root "
        "cause ended this many attempts and the last got no further (epoch, step, "
        "checkpoints).", min=1
    )
    policy_max_recurrence_transient: int = setting(
        3, "Nondeterministic verdicts: the same, for a transient-looking root that keeps "
        "ending the job without progress.", min=1
    )
    policy_max_excluded_nodes: int = setting(
        4, "Most nodes a decision asks to exclude (the most recently blamed kept).", min=0
    )
    policy_history_max: int = setting(
        16, "Attempts remembered per job (the newest).", min=1
    )
    nodes_suspect_jobs: int = setting(
        3, "sibylla nodes: a node blamed by failures of at least this many jobs is a suspect.",
        min=1
    )

    # --- Slurm (README: Slurm) ----------------------------------------------------------------
    slurm_scontrol: str = setting("scontrol", "The scontrol command (a path or a name on PATH).")
    slurm_command_timeout_s: float = setting(
        5.0, "Longest wait for one scontrol call (the epilog must never hold slurmctld).",
        min=0.1
    )
    slurm_epilog_timeout_s: float = setting(
        20.0, "Longest the epilog may take in all; past it, it gives up and exits non-zero.",
        min=1.0
    )
    slurm_epilog_max_bytes: int = setting(
        4 << 20, "Most output bytes the epilog ships per attempt (the first and the last half).",
        min=1024
    )
    slurm_epilog_state_dir: Path = setting(
        Path("/var/spool/sibylla-epilog"), "Where the epilog remembers how much of each job's "
        "output file earlier attempts shipped (with --open-mode=append, each attempt ships "
        "only its own lines)."
    )
    slurm_actuator_group: str = setting(
        "", "Consumer group of sibylla slurm actuator (its committed offsets make it safe to "
        "restart). Empty: <the topic prefix without its trailing dot>-slurm-actuator "
        "(sibylla-slurm-actuator)."
    )
    slurm_mode: Literal["apply", "dry-run"] = setting(
        "apply", "dry-run: the actuator prints the scontrol commands it would run, runs none."
    )
    slurm_do_not_retry: Literal["leave", "requeuehold"] = setting(
        "leave", "do_not_retry: leave the job failed, or requeue it held for a human to "
        "release or cancel."
    )
    slurm_default_retries: int = setting(
        1, "default_policy (the site's rule): requeue while the job has restarted fewer "
        "times than this; 0 leaves it failed.", min=0
    )
    slurm_audit_file: str = setting(
        "", "Where the actuator appends one JSON line per decision it handles; empty: stdout."
    )
    slurm_actuator_metrics_port: int = setting(
        9467, "Port of the actuator's /metrics (0: none).", min=0, max=65535
    )
    slurm_settle_s: float = setting(
        30.0, "Longest the actuator waits for a job to leave COMPLETING before acting.",
        min=0.0
    )

    # --- worker -------------------------------------------------------------------------------
    store: StoreKind = setting("rocksdb", "Table store: rocksdb (production) or memory.")
    data_dir: Path = setting(Path("sibylla-data"), "Where the worker keeps its table stores.")
    web_host: str = setting("127.0.0.1", "Bind address of the worker's HTTP server.")
    web_port: int = setting(6066, "Port of the worker's HTTP server (status page, /ready, "
                            "/metrics, decisions).", min=0, max=65535)
    log_level: Literal["debug", "info", "warning", "error"] = setting("info", "Log level.")

    # ------------------------------------------------------------------------------------------
    def topic(self, name: str) -> str:
        """Full topic name for a contract topic such as ``logs`` or ``decisions``."""
        return f"{self.topic_prefix}{name}"

    @property
    def broker_url(self) -> str:
        """The faust broker URL for the bootstrap servers."""
        hosts = ";".join(h.strip() for h in self.bootstrap_servers.split(",") if h.strip())
        return f"kafka://{hosts}"

    def kafka_client_options(self) -> dict[str, Any]:
        """Security options passed straight through to aiokafka clients."""
        opts: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.security_protocol.startswith("SASL"):
            opts.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        if self.security_protocol.endswith("SSL"):
            import ssl

            context = ssl.create_default_context(cafile=self.ssl_cafile or None)
            if self.ssl_certfile:
                context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile or None)
            opts["ssl_context"] = context
        return opts

    def redacted(self) -> dict[str, Any]:
        """The settings as a dict with secrets masked, safe to log."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = "***" if f.metadata.get("secret") and value else value
        return out

    def to_env(self) -> dict[str, str]:
        """``SIBYLLA_*`` variables that rebuild these settings in a child process."""
        return env_of(self)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Settings from ``SIBYLLA_*`` variables, then ``overrides`` (already typed or str)."""
        return cls(**values_from_env(cls, env, overrides))

    def __post_init__(self) -> None:
        check_fields(self)
        # Groups named after the topic prefix: a second deployment on the same Kafka (another
        # Slurm cluster, whose job ids repeat the first one's) that sets only its own prefix
        # gets its own groups and changelogs instead of sharing the first one's tables.
        base = self.topic_prefix.rstrip("._-") or "sibylla"
        if not self.group_id:
            object.__setattr__(self, "group_id", base)
        if not self.slurm_actuator_group:
            object.__setattr__(self, "slurm_actuator_group", f"{base}-slurm-actuator")
        if self.security_protocol.startswith("SASL") and not self.sasl_username:
            raise SettingsError("sasl_username: required when security_protocol uses SASL")


def env_of(settings: Any) -> dict[str, str]:
    """``SIBYLLA_*`` variables that rebuild a settings dataclass in a child process (secrets
    included: the child needs them; an environment is not a log)."""
    return {ENV_PREFIX + f.name.upper(): str(getattr(settings, f.name))
            for f in dataclasses.fields(settings)}


def values_from_env(cls: type, env: Mapping[str, str] | None, overrides: Mapping[str, Any]
                    ) -> dict[str, Any]:
    """Typed values for the settings dataclass ``cls``: its ``SIBYLLA_<NAME>`` variables in
    ``env`` (the process environment when None), then ``overrides`` (typed or str; None is
    skipped). An override naming no field is a :class:`SettingsError`."""
    env = os.environ if env is None else env
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for f in fields.values():
        raw = env.get(ENV_PREFIX + f.name.upper())
        if raw is not None:
            values[f.name] = parse_setting(f, raw, source=ENV_PREFIX + f.name.upper())
    for name, value in overrides.items():
        if value is None:
            continue
        if name not in fields:
            raise SettingsError(f"unknown setting {name!r}")
        values[name] = parse_setting(fields[name], value, source=f"--{name.replace('_', '-')}")
    return values


def check_fields(settings: Any) -> None:
    """Every field of a settings dataclass within its bounds (:func:`check_bounds`)."""
    for f in dataclasses.fields(settings):
        check_bounds(f, getattr(settings, f.name), f.name)


def parse_setting(f: dataclasses.Field[Any], raw: Any, source: str) -> Any:
    t = f.type
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    try:
        if t is bool:
            if text.lower() in TRUE_WORDS | FALSE_WORDS:
                return text.lower() in TRUE_WORDS
            raise ValueError("expected true or false")
        if t is int:
            return int(text)
        if t is float:
            return float(text)
        if t is Path:
            return Path(text)
        choices = get_args(t)
        if choices:
            if text in choices:
                return text
            if text.upper() in choices:
                return text.upper()
            if text.lower() in choices:
                return text.lower()
            raise ValueError(f"expected one of {', '.join(map(str, choices))}")
        return raw
    except ValueError as exc:
        raise SettingsError(f"{source}={raw!r}: {exc}") from None


def check_bounds(f: dataclasses.Field[Any], value: Any, name: str) -> None:
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if (lo is not None or hi is not None) and value != value:
        raise SettingsError(f"{name}={value!r}: must be a number")  # NaN passes every bound
    if lo is not None and value < lo:
        raise SettingsError(f"{name}={value!r}: must be >= {lo}")
    if hi is not None and value > hi:
        raise SettingsError(f"{name}={value!r}: must be <= {hi}")


# The settings a client of Sibylla's topics needs (``--only`` of CLIs that only read or write).
CONNECTION = frozenset({"bootstrap_servers", "topic_prefix", "security_protocol",
                        "sasl_mechanism", "sasl_username", "sasl_password", "ssl_cafile",
                        "ssl_certfile", "ssl_keyfile"})


def add_settings_arguments(parser: argparse.ArgumentParser,
                           only: Collection[str] | None = None) -> None:
    """Add a ``--flag`` for every setting (or those in ``only``) to a CLI parser."""
    group = parser.add_argument_group("settings (also SIBYLLA_<NAME> variables)")
    for f in dataclasses.fields(Settings):
        if only is not None and f.name not in only:
            continue
        group.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f"setting_{f.name}",
            default=None,
            metavar=f.name.upper(),
            help=f"{f.metadata['help']} (default: {f.default})",
        )


def settings_from_args(
    args: argparse.Namespace, env: Mapping[str, str] | None = None, **defaults: Any
) -> Settings:
    """Settings from environment plus the flags added by :func:`add_settings_arguments`.

    ``defaults`` apply only where neither a flag nor a variable set the value (the demo uses
    this to default to the memory store, for instance).
    """
    env = os.environ if env is None else env
    flags = {
        name[len("setting_"):]: value
        for name, value in vars(args).items()
        if name.startswith("setting_") and value is not None
    }
    base = {k: v for k, v in defaults.items() if ENV_PREFIX + k.upper() not in env}
    base.update(flags)
    return Settings.from_env(env, **base)

