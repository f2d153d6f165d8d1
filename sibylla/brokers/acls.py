"""The Kafka ACLs each Sibylla principal needs, and nothing more: the one list the README's
table, ``sibylla acls`` and the ACL integration test all read.

Who writes a topic is who the topic's readers trust: a shipper that could write
``sibylla.decisions`` could tell schedulers to stop any job, one that could write
``sibylla.models`` could pick the model every worker runs. So:

- a **shipper** writes ``logs``; a **scheduler** hook writes ``job-events`` and reads
  ``decisions``, in the Slurm actuator's consumer group (whose committed offsets make a
  restart safe; ``sibylla decisions --follow`` uses no group);
- a **worker** reads what it consumes, writes what it publishes (``decisions``, ``labels``,
  ``deadletter``, its internal ``label-votes``, and ``logs``, where it
  re-publishes a record keyed by something else than its job_id), reads ``models``, owns the
  topics named ``<group>-*`` (its tables' changelogs, faust's leader topic) and reads in its
  consumer group;
- the **trainer** reads ``labels``, writes ``models``, and may describe the topics it checks
  at start.

Topics are created by an administrator (``sibylla acls --apply`` does it with the admin's
credentials), so no principal needs CREATE on the contract's topics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from sibylla.settings import Settings

__all__ = ["GRANTS", "ROLES", "Binding", "Grant", "apply_acls", "bindings",
           "kafka_acls_commands"]

ROLES = ("shipper", "scheduler", "worker", "trainer")
GROUP = "{group}"  # the workers' consumer group (Settings.group_id)
GROUP_TOPICS = "{group}-"  # topics named after the group: changelogs, faust's leader topic
ACTUATOR_GROUP = "{actuator_group}"  # the Slurm actuator's group (Settings.slurm_actuator_group)
ALL_TOPICS = "{prefix}"  # every contract topic (Settings.topic_prefix)


@dataclass(frozen=True)
class Grant:
    """Operations ``role`` may do on a topic or group. ``name``: a contract topic (``logs``),
    or one of the placeholders above."""

    role: str
    resource: Literal["topic", "group"]
    name: str
    operations: tuple[str, ...]
    why: str
    prefixed: bool = False


GRANTS: tuple[Grant, ...] = (
    Grant("shipper", "topic", "logs", ("WRITE",), "publishes job log lines"),
    Grant("scheduler", "topic", "job-events", ("WRITE",), "publishes job events"),
    Grant("scheduler", "topic", "decisions", ("READ",), "acts on decisions"),
    Grant("scheduler", "group", ACTUATOR_GROUP, ("READ",), "the Slurm actuator's consumer group"),
    Grant("worker", "topic", "logs", ("READ", "WRITE"),
          "reads lines; re-publishes a record under its job_id"),
    Grant("worker", "topic", "job-events", ("READ",), "reads terminations and retry outcomes"),
    Grant("worker", "topic", "label-votes", ("READ", "WRITE"), "operator votes (POST /labels)"),
    Grant("worker", "topic", "decisions", ("WRITE",), "publishes decisions"),
    Grant("worker", "topic", "labels", ("WRITE",), "publishes labels"),
    Grant("worker", "topic", "deadletter", ("WRITE",), "rejects bad records"),
    Grant("worker", "topic", "models", ("READ",), "follows signed model announcements"),
    Grant("worker", "topic", GROUP_TOPICS, ("ALL",), "its tables' changelogs, faust's leader "
          "topic", prefixed=True),
    Grant("worker", "group", GROUP, ("READ",), "the workers' consumer group"),
    Grant("trainer", "topic", "labels", ("READ",), "reads labels"),
    Grant("trainer", "topic", "models", ("WRITE",), "announces promoted models"),
    Grant("trainer", "topic", ALL_TOPICS, ("DESCRIBE",), "checks partition counts at start",
          prefixed=True),
    Grant("trainer", "topic", GROUP_TOPICS, ("DESCRIBE",), "checks partition counts at start",
          prefixed=True),
)

# Kafka's protocol codes (org.apache.kafka.common.acl / resource).
_RESOURCE = {"topic": 2, "group": 3}
_PATTERN = {False: 3, True: 4}  # LITERAL, PREFIXED
_OPERATION = {"ALL": 2, "READ": 3, "WRITE": 4, "CREATE": 5, "DESCRIBE": 8}
_ALLOW = 3


@dataclass(frozen=True)
class Binding:
    """One ACL: ``principal`` may do ``operation`` on a resource."""

    principal: str
    resource: Literal["topic", "group"]
    name: str
    prefixed: bool
    operation: str


def _resolve(name: str, resource: str, settings: Settings) -> str:
    if name in (GROUP, GROUP_TOPICS):
        return name.format(group=settings.group_id)
    if name == ACTUATOR_GROUP:
        return settings.slurm_actuator_group
    if name == ALL_TOPICS:
        return settings.topic_prefix
    return settings.topic(name) if resource == "topic" else name


def bindings(settings: Settings, users: Mapping[str, str]) -> list[Binding]:
    """Every ACL of :data:`GRANTS` for the roles in ``users`` (role -> Kafka user name)."""
    unknown = set(users) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}; roles are {', '.join(ROLES)}")
    return [Binding(f"User:{users[g.role]}", g.resource, _resolve(g.name, g.resource, settings),
                    g.prefixed, op)
            for g in GRANTS if g.role in users for op in g.operations]


def kafka_acls_commands(settings: Settings, users: Mapping[str, str]) -> list[str]:
    """The same ACLs as ``kafka-acls.sh`` command lines, for clusters administered with
    Kafka's own tools (``$ADMIN_CONFIG``: the admin's client properties)."""
    lines = []
    for b in bindings(settings, users):
        pattern = " --resource-pattern-type prefixed" if b.prefixed else ""
        lines.append(f"kafka-acls.sh --bootstrap-server {settings.bootstrap_servers or '$BOOT'}"
                     f" --command-config $ADMIN_CONFIG --add --allow-principal {b.principal}"
                     f" --operation {b.operation.capitalize()} --{b.resource} {b.name}{pattern}")
    return lines


async def apply_acls(admin: Settings, acls: Sequence[Binding]) -> None:
    """Create ``acls`` with the admin's credentials (CreateAcls; existing ones are kept)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.protocol.admin import CreateAclsRequest

    client = AIOKafkaAdminClient(bootstrap_servers=admin.bootstrap_servers,
                                 **admin.kafka_client_options())
    await client.start()
    try:
        for b in acls:
            request = CreateAclsRequest(_RESOURCE[b.resource], b.name, _PATTERN[b.prefixed],
                                        b.principal, "*", _OPERATION[b.operation], _ALLOW)
            response = await client._send_request(request)  # noqa: SLF001 - no public API
            for code, message in response.creation_responses:
                if code:
                    raise RuntimeError(f"CreateAcls {b}: error {code} {message or ''}")
    finally:
        await client.close()
