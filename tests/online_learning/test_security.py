"""Only the trainer promotes models, only operators label: forged, unsigned, replayed and
out-of-root model announcements are refused and counted by reason; a refused sequence stays
refused after a restart; operator requests need a configured bearer token; keys are made
with the right file modes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson
import pytest
from prometheus_client import generate_latest

from sibylla.cli import main
from sibylla.inference.checkpoint import save_checkpoint
from sibylla.online_learning.announce import announcement, sha256_file
from sibylla.online_learning.operators import OperatorAuthError, OperatorTokens
from sibylla.online_learning.settings import OnlineSettings
from sibylla.online_learning.signing import (
    SigningKeyError,
    generate_key_pair,
    load_private_key,
)
from sibylla.online_learning.store import ModelStore
from sibylla.online_learning.worker import OnlineLearning
from sibylla.settings import SettingsError
from tests.online_learning.fixtures import examples, tiny_checkpoint
from tests.online_learning.test_worker_votes import loop

NAME = "sibylla-classifier"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny model files in a models directory, and one outside it."""
    root = tmp_path_factory.mktemp("security")
    train = examples(16)
    paths = {}
    for version, where in (("v1", "models"), ("v2", "models"), ("evil", "elsewhere")):
        cp = tiny_checkpoint(train, version=version)
        paths[version] = save_checkpoint(cp.model, cp.vocab, cp.meta,
                                         root / where / f"{version}.safetensors")
    return paths


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, str, Path, str]:
    """The trainer's key pair and an attacker's."""
    trainer, trainer_pub = generate_key_pair(tmp_path / "trainer.key")
    attacker, attacker_pub = generate_key_pair(tmp_path / "attacker.key")
    return tmp_path / "trainer.key", trainer_pub, tmp_path / "attacker.key", attacker_pub


def worker(models: dict[str, Path], data_dir: Path, public_key: str = "",
           allow_unsigned: bool = False) -> OnlineLearning:
    online = OnlineSettings(models_dir=models["v1"].parent, model_public_key=public_key,
                            allow_unsigned_models=allow_unsigned)
    return loop(online, data_dir)[0]


def announce(path: Path, version: str, sequence: int, key_path: Path | None) -> bytes:
    key = load_private_key(key_path) if key_path else None
    return announcement(NAME, version, path, sha256_file(path), {"real": 0.9}, sequence,
                        key).to_json()


def refused(ol: OnlineLearning) -> dict[str, float]:
    out = {}
    for line in generate_latest(ol.p.metrics.registry).decode().splitlines():
        if line.startswith("sibylla_model_announcements_rejected_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            out[reason] = float(line.split()[-1])
    return out


async def test_only_announcements_the_trainer_signed_are_loaded(
        models: dict[str, Path], keys: tuple[Path, str, Path, str], tmp_path: Path) -> None:
    trainer, public, attacker, _ = keys
    ol = worker(models, tmp_path / "worker", public)
    # Unsigned, signed by another key, or altered after signing: refused before any load.
    assert not await ol.on_announcement(announce(models["v1"], "v1", 5, None))
    assert not await ol.on_announcement(announce(models["v1"], "v1", 5, attacker))
    genuine = orjson.loads(announce(models["v1"], "v1", 5, trainer))
    for field, value in (("uri", models["evil"].as_uri()), ("sequence", 99),
                         ("sha256", sha256_file(models["evil"]))):
        assert not await ol.on_announcement(orjson.dumps({**genuine, field: value}))
    assert ol.p.swapped == []
    assert refused(ol) == {"unsigned": 1.0, "bad_signature": 4.0}
    # The genuine one is loaded.
    assert await ol.on_announcement(orjson.dumps(genuine))
    assert [c.version for c in ol.p.swapped] == ["v1"]


async def test_an_older_announcement_is_refused_even_after_a_restart_and_a_rollback_is_newer(
        models: dict[str, Path], keys: tuple[Path, str, Path, str], tmp_path: Path) -> None:
    trainer, public, _, _ = keys
    old_v1 = announce(models["v1"], "v1", 10, trainer)
    v2 = announce(models["v2"], "v2", 11, trainer)
    ol = worker(models, tmp_path / "worker", public)
    assert await ol.on_announcement(old_v1)
    assert await ol.on_announcement(v2)
    restarted = worker(models, tmp_path / "worker", public)  # same data_dir, fresh process
    assert not await restarted.on_announcement(old_v1)  # a replay of a genuine announcement
    assert refused(restarted) == {"replayed": 1.0}
    assert await restarted.on_announcement(v2)  # the current one, read again from the topic
    rollback = announce(models["v1"], "v1", 12, trainer)
    assert await restarted.on_announcement(rollback)
    assert [c.version for c in restarted.p.swapped] == ["v2", "v1"]


async def test_model_files_outside_the_roots_are_refused_through_symlinks_and_dotdot(
        models: dict[str, Path], keys: tuple[Path, str, Path, str], tmp_path: Path) -> None:
    trainer, public, _, _ = keys
    root = models["v1"].parent
    link = root / "linked.safetensors"
    if not link.exists():
        link.symlink_to(models["evil"])
    dotdot = root / ".." / "elsewhere" / "evil.safetensors"
    ol = worker(models, tmp_path / "worker", public)
    for n, path in enumerate((models["evil"], link, dotdot)):
        # Signed by the trainer's key, and still refused: a key may leak, the volume is fixed.
        assert not await ol.on_announcement(announce(path, "evil", n, trainer))
    assert refused(ol) == {"outside_roots": 3.0}
    assert ol.p.swapped == []


async def test_without_a_public_key_announcements_are_refused_unless_explicitly_allowed(
        models: dict[str, Path], tmp_path: Path) -> None:
    ol = worker(models, tmp_path / "strict")
    assert not await ol.on_announcement(announce(models["v1"], "v1", 1, None))
    assert refused(ol) == {"unsigned": 1.0}
    lax = worker(models, tmp_path / "lax", allow_unsigned=True)
    assert await lax.on_announcement(announce(models["v1"], "v1", 1, None))


def test_store_sequences_only_grow(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    first = store.next_sequence()
    assert ModelStore(tmp_path).next_sequence() > first  # re-read by another process


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "trainer.key"
    assert main(["models", "keygen", str(key)]) == 0
    out = capsys.readouterr().out
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    public = (tmp_path / "trainer.key.pub").read_text().strip()
    assert f"SIBYLLA_MODEL_PUBLIC_KEY={public}" in out
    assert "PRIVATE KEY" not in out and key.read_text().split("\n")[1] not in out
    before = key.read_bytes()
    assert main(["models", "keygen", str(key)]) == 1
    assert key.read_bytes() == before
    load_private_key(key)
    os.chmod(key, 0o644)
    with pytest.raises(SigningKeyError, match="readable by others"):
        load_private_key(key)


def test_a_trainer_with_an_unusable_key_does_not_start(tmp_path: Path) -> None:
    from sibylla.online_learning.service import signing_key

    with pytest.raises(SettingsError, match="model_signing_key"):
        signing_key(OnlineSettings(model_signing_key=str(tmp_path / "missing.key")))


def test_a_bad_public_key_or_tokens_file_stops_the_worker_with_a_line_naming_it(
        models: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="model_public_key: not an Ed25519 public key"):
        worker(models, tmp_path, public_key="not-a-key")
    missing = OnlineSettings(operator_tokens_file=str(tmp_path / "missing"))
    with pytest.raises(SettingsError, match="operator_tokens_file: .*missing"):
        loop(missing)


def test_sibylla_label_without_a_token_says_which_variable_to_set(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SIBYLLA_OPERATOR_TOKEN", raising=False)
    assert main(["label", "job", "0", "deterministic", "--url", "http://127.0.0.1:9"]) == 2
    assert "SIBYLLA_OPERATOR_TOKEN" in capsys.readouterr().err


def test_online_settings_travel_to_a_worker_process_unchanged(tmp_path: Path) -> None:
    online = OnlineSettings(models_dir=tmp_path, allow_unsigned_models=True,
                            model_public_key="k", operator_tokens_file="/etc/t")
    assert OnlineSettings.from_env(online.to_env()) == online


def tokens_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "operators"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_operator_tokens_name_who_labels_and_refuse_everyone_else(tmp_path: Path) -> None:
    tokens = OperatorTokens.from_file(tokens_file(
        tmp_path, "# on-call\nalice:alice-token-0123456789\nbob:bob-token-0123456789abc\n"))
    assert tokens.operator("Bearer alice-token-0123456789") == "alice"
    assert tokens.operator("bearer bob-token-0123456789abc") == "bob"
    for header, status, reason in ((None, 401, "missing_token"), ("", 401, "missing_token"),
                                   ("Basic YWxpY2U6eA==", 401, "malformed"),
                                   ("Bearer", 401, "malformed"),
                                   ("Bearer alice-token-012345678", 403, "wrong_token"),
                                   ("Bearer bob-token-0123456789abc0", 403, "wrong_token")):
        with pytest.raises(OperatorAuthError) as err:
            tokens.operator(header)
        assert (err.value.status, err.value.reason) == (status, reason)
        assert "token-0123" not in err.value.message


@pytest.mark.parametrize("text,mode,message", [
    ("alice:short\n", 0o600, "shorter than 16"),
    ("alice token-0123456789abcdef\n", 0o600, "expected 'name:token'"),
    ("alice:token-0123456789abcdef\nalice:token-0123456789abcdeg\n", 0o600, "twice"),
    ("# nobody\n", 0o600, "no 'name:token'"),
    ("alice:token-0123456789abcdef\n", 0o644, "readable by others"),
])
def test_a_bad_tokens_file_is_refused_without_echoing_its_tokens(
        tmp_path: Path, text: str, mode: int, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        OperatorTokens.from_file(tokens_file(tmp_path, text, mode))
    assert "0123456789" not in str(err.value)


def test_without_a_tokens_file_operator_labels_are_disabled_not_open() -> None:
    ol, _ = loop()
    with pytest.raises(OperatorAuthError) as err:
        ol.operator("Bearer anything-at-all-0123456789")
    assert err.value.status == 403 and "SIBYLLA_OPERATOR_TOKENS_FILE" in err.value.message
    metrics = generate_latest(ol.p.metrics.registry).decode()
    assert 'sibylla_operator_requests_refused_total{reason="disabled"} 1.0' in metrics


def test_unsigned_models_setting_parses_booleans_strictly() -> None:
    assert OnlineSettings.from_env({"SIBYLLA_ALLOW_UNSIGNED_MODELS": "true"}
                                   ).allow_unsigned_models
    assert not OnlineSettings.from_env({"SIBYLLA_ALLOW_UNSIGNED_MODELS": "0"}
                                       ).allow_unsigned_models
    with pytest.raises(SettingsError, match="SIBYLLA_ALLOW_UNSIGNED_MODELS"):
        OnlineSettings.from_env({"SIBYLLA_ALLOW_UNSIGNED_MODELS": "maybe"})
