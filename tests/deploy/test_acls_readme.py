"""The README's ACL table says what ``sibylla/brokers/acls.py`` grants, no more, no less;
``sibylla acls`` prints them for the principals it is given."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sibylla.brokers.acls import GRANTS, bindings
from sibylla.cli import main
from sibylla.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_rows() -> list[tuple[str, str, str]]:
    text = README.read_text()
    table = text[text.index("| principal | resource"):].split("\n\n")[0]
    rows = [line.split("|")[1:4] for line in table.splitlines()[2:]]
    return [(role.strip(), resource.strip(), ops.strip()) for role, resource, ops in rows]


def test_every_grant_is_in_the_readme_table_and_every_row_is_a_grant() -> None:
    settings = Settings.from_env({})
    users = {g.role: g.role for g in GRANTS}
    documented = set()
    for role, resource, ops in readme_rows():
        names = re.findall(r"`([^`]+)`", resource)
        kind = resource.split()[0].rstrip("s")
        for name in names:
            for op in re.match(r"[A-Za-z, ]+", ops).group(0).split(","):  # type: ignore[union-attr]
                documented.add((f"User:{role}", kind, name, "prefixed" in resource,
                                op.strip().upper()))
    granted = {(b.principal, b.resource, b.name, b.prefixed, b.operation)
               for b in bindings(settings, users)}
    assert documented == granted


def test_sibylla_acls_prints_the_kafka_acls_commands_of_the_named_principals(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acls", "--shipper", "fluentbit", "--topic-prefix", "prod.",
                 "--bootstrap-servers", ""]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["kafka-acls.sh --bootstrap-server $BOOT --command-config $ADMIN_CONFIG "
                     "--add --allow-principal User:fluentbit --operation Write --topic "
                     "prod.logs"]
    assert main(["acls"]) == 2  # no principal named: a clear error, not an empty ACL set
