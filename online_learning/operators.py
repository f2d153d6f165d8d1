"""Who may label: operators with a bearer token, each token tied to a name.

An operator's label outweighs every other vote, so ``POST /labels/{job_id}/{attempt}`` is the
easiest way to steer the training data; a worker accepts it only with
``Authorization: Bearer <token>`` naming a token of ``SIBYLLA_OPERATOR_TOKENS_FILE``, whose
lines are ``name:token`` (``#`` starts a comment). The name goes into the vote (``by``), so
every label says who gave it. Without a tokens file the endpoint is disabled (403 saying how
to enable it), never open.

Tokens are compared with :func:`hmac.compare_digest`, against every configured token, so the
time a request takes says nothing about how much of a token it guessed; a token is never
logged, echoed or counted by value.
"""

from __future__ import annotations

import hmac
import re
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MIN_TOKEN_CHARS", "OperatorAuthError", "OperatorTokens", "bearer_token"]

MIN_TOKEN_CHARS = 16
_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")


@dataclass(frozen=True)
class OperatorAuthError(Exception):
    """A refused request: HTTP ``status`` (401 or 403), a message for the caller and the
    ``reason`` label of the refusal metric."""

    status: int
    reason: str
    message: str


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; 401 when absent or malformed."""
    if not header:
        raise OperatorAuthError(401, "missing_token", "an operator's bearer token is required: "
                                "send 'Authorization: Bearer <token>'")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or " " in token.strip():
        raise OperatorAuthError(401, "malformed", "malformed Authorization header: expected "
                                "'Bearer <token>'")
    return token.strip()


class OperatorTokens:
    """The ``name:token`` pairs a worker accepts (see module docstring)."""

    def __init__(self, pairs: dict[str, str]) -> None:
        self._pairs = [(name, token.encode()) for name, token in pairs.items()]

    @classmethod
    def from_file(cls, path: str | Path) -> OperatorTokens:
        """Read and check the tokens file; ``ValueError`` names the line (never its token)."""
        path = Path(path)
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(f"{path}: the operator tokens file is readable by others (mode "
                             f"{stat.S_IMODE(mode):04o}); chmod 600 it")
        pairs: dict[str, str] = {}
        for n, line in enumerate(path.read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, token = line.partition(":")
            if not sep or not _NAME.fullmatch(name) or any(c.isspace() for c in token):
                raise ValueError(f"{path}:{n}: expected 'name:token' (name of letters, digits, "
                                 "._@-; token without spaces)")
            if len(token) < MIN_TOKEN_CHARS:
                raise ValueError(f"{path}:{n}: the token of {name!r} is shorter than "
                                 f"{MIN_TOKEN_CHARS} characters")
            if name in pairs or token in pairs.values():
                raise ValueError(f"{path}:{n}: {name!r} or its token appears twice")
            pairs[name] = token
        if not pairs:
            raise ValueError(f"{path}: no 'name:token' line")
        return cls(pairs)

    def operator(self, header: str | None) -> str:
        """The operator name the request's bearer token belongs to; :class:`OperatorAuthError`
        401 without a well-formed token, 403 with a token not configured."""
        given = bearer_token(header).encode()
        found = ""
        for name, token in self._pairs:  # every token compared: no early exit
            if hmac.compare_digest(given, token):
                found = name
        if not found:
            raise OperatorAuthError(403, "wrong_token", "this token is not an operator's")
        return found


DISABLED = OperatorAuthError(
    403, "disabled", "operator labels are disabled on this worker: set "
    "SIBYLLA_OPERATOR_TOKENS_FILE to a file of 'name:token' lines (mode 600) and restart it")
