"""Ed25519 signatures of model announcements: the trainer signs, workers verify.

An announcement on ``sibylla.models`` names a file and its SHA-256; without a signature,
whoever can produce to the topic could make every worker load a model of their choosing
(safetensors stops code execution, not poisoning). The trainer holds the private key (a file
only it can read); workers hold the public key (``SIBYLLA_MODEL_PUBLIC_KEY``, not a secret).

What is signed is the announcement's JSON object without its ``signature`` field, with sorted
keys: the worker verifies the object it received, not its own re-encoding of the fields it
knows, so a field a newer trainer adds is covered by the signature and does not break it.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

__all__ = ["SigningKeyError", "generate_key_pair", "load_private_key", "load_public_key",
           "public_key_text", "sign", "signature_valid", "signed_bytes"]

SIGNATURE_FIELD = "signature"


class SigningKeyError(ValueError):
    """A key file or key text cannot be used; the message says why (never the key itself)."""


def signed_bytes(record: dict[str, Any]) -> bytes:
    """The bytes a signature covers: the record without its signature, keys sorted."""
    return orjson.dumps({k: v for k, v in record.items() if k != SIGNATURE_FIELD},
                        option=orjson.OPT_SORT_KEYS)


def sign(key: Ed25519PrivateKey, record: dict[str, Any]) -> str:
    """The base64 signature of ``record`` (see :func:`signed_bytes`)."""
    return base64.b64encode(key.sign(signed_bytes(record))).decode()


def signature_valid(key: Ed25519PublicKey, record: dict[str, Any]) -> bool:
    """Whether ``record[signature]`` is ``key``'s signature of the rest of ``record``."""
    text = record.get(SIGNATURE_FIELD)
    if not isinstance(text, str):
        return False
    try:
        key.verify(base64.b64decode(text, validate=True), signed_bytes(record))
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


def public_key_text(key: Ed25519PublicKey) -> str:
    """The public key as workers configure it: base64 of its 32 raw bytes."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def load_public_key(text: str) -> Ed25519PublicKey:
    """A public key from :func:`public_key_text`'s form."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError):
        raise SigningKeyError("not an Ed25519 public key (base64 of 32 bytes, as "
                        "`sibylla models keygen` prints it)") from None


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """The trainer's private key from a PEM file readable by its owner only."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"{path}: cannot read the signing key: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SigningKeyError(f"{path}: the signing key is readable by others (mode "
                        f"{stat.S_IMODE(mode):04o}); chmod 600 it")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise SigningKeyError(f"{path}: not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{path}: not an Ed25519 key")
    return key


def generate_key_pair(private_path: str | Path) -> tuple[Path, str]:
    """Write a new private key to ``private_path`` (mode 0600, never over an existing file)
    and its public key to ``<private_path>.pub``; returns that path and the public key."""
    private_path = Path(private_path)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise SigningKeyError(f"{private_path} exists; not overwriting a key") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public = public_key_text(key.public_key())
    public_path = private_path.with_name(private_path.name + ".pub")
    public_path.write_text(public + "\n")
    return public_path, public
