"""Users and ACL 2.0 rules as RocketMQ 5.3.3's ``auth`` module defines them, and how a rule matches.

* A **user** has a name (the access key), a password (the secret key), a type (``Super``: every action
  allowed; ``Normal``: what its rules allow) and a status (``enable`` / ``disable``).
* An **ACL** belongs to a subject (``User:<name>``) and holds policy entries: a resource
  (``Topic:orders``, ``Group:billing-*`` — a name ending in ``*`` is a prefix —, ``Topic:*``, ``Cluster:*``,
  or ``*`` for anything), actions (``Pub``, ``Sub``, ``Create``, ``Update``, ``Delete``, ``Get``, ``List``, or
  ``All``), optional source IPs (addresses or CIDR ranges) and a decision, ``Allow`` or ``Deny``.
* A request (resource, the actions that would each permit it, source IP) takes the most specific entry
  that matches it — a named resource type before ``*``, a literal name before a prefix, a longer prefix
  before a shorter one, a prefix before ``Topic:*`` — and, among equally specific ones, ``Deny``. No
  matching entry: denied. (RocketMQ's ``AclAuthorizationHandler`` means this order; its comparator's
  literal-versus-prefix branch does not sort as written, so the intended order is the one kept here.)
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rocketstore.errors import RocketstoreError

__all__ = ["Acl", "Action", "AclError", "Decision", "PolicyEntry", "Resource", "ResourcePattern", "ResourceType",
           "User", "UserStatus", "UserType", "by_name", "parse_actions", "parse_source_ips", "subject_of"]


class AclError(RocketstoreError, ValueError):
    """A user or rule that cannot be stored as given; the message says what to change. ``code`` names the
    gRPC status to answer (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS)."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.code = code


class UserType(enum.Enum):
    SUPER = "Super"
    NORMAL = "Normal"


class UserStatus(enum.Enum):
    ENABLE = "enable"
    DISABLE = "disable"


class ResourceType(enum.Enum):
    ANY = "Any"
    CLUSTER = "Cluster"
    TOPIC = "Topic"
    GROUP = "Group"


class ResourcePattern(enum.Enum):
    ANY = "ANY"
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Action(enum.Enum):
    ALL = "All"
    ANY = "Any"
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"


class Decision(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"


def by_name(kind: type[enum.Enum], text: str, what: str) -> Any:
    for member in kind:
        if member.value.lower() == text.strip().lower():
            return member
    raise AclError(f"{what} {text!r} is not one of {', '.join(m.value for m in kind)}")


@dataclass
class User:
    username: str
    password: str
    user_type: UserType = UserType.NORMAL
    user_status: UserStatus = UserStatus.ENABLE

    def __post_init__(self) -> None:
        if not self.username or any(c in self.username for c in " ,=/:\t\n"):
            raise AclError(f"username {self.username!r} is empty or has a space, ',', '=', '/' or ':'")
        if not self.password:
            raise AclError(f"user {self.username!r} needs a password (its secret key)")

    def to_json(self) -> dict[str, Any]:
        return {"password": self.password, "userStatus": self.user_status.value, "userType": self.user_type.value,
                "username": self.username}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> User:
        return cls(str(data["username"]), str(data["password"]),
                   by_name(UserType, str(data.get("userType", "Normal")), "userType"),
                   by_name(UserStatus, str(data.get("userStatus", "enable")), "userStatus"))


def subject_of(username: str) -> str:
    return f"User:{username}"


class Resource(NamedTuple):  # a tuple: made for every check of every call, so cheap to build
    type: ResourceType
    name: str | None
    pattern: ResourcePattern

    @classmethod
    def parse(cls, key: str) -> Resource:
        """``Topic:orders``, ``Group:g-*``, ``Topic:*``, ``*`` (RocketMQ's ``Resource.of``)."""
        key = key.strip()
        if key == "*":
            return cls(ResourceType.ANY, None, ResourcePattern.ANY)
        kind, colon, name = key.partition(":")
        if not colon or not name:
            raise AclError(f"resource {key!r} is not TYPE:NAME (Topic:orders, Group:g-*, Topic:*) or *")
        rtype = by_name(ResourceType, kind, "resource type")
        if rtype is ResourceType.ANY:
            raise AclError(f"resource {key!r}: write * alone for any resource")
        if name == "*":
            return cls(rtype, None, ResourcePattern.ANY)
        if name.endswith("*"):
            return cls(rtype, name[:-1], ResourcePattern.PREFIXED)
        return cls(rtype, name, ResourcePattern.LITERAL)

    @classmethod
    def topic(cls, name: str) -> Resource:
        return cls(ResourceType.TOPIC, name, ResourcePattern.LITERAL)

    @classmethod
    def group(cls, name: str) -> Resource:
        return cls(ResourceType.GROUP, name, ResourcePattern.LITERAL)

    @classmethod
    def cluster(cls, name: str) -> Resource:
        return cls(ResourceType.CLUSTER, name, ResourcePattern.LITERAL)

    @property
    def key(self) -> str:
        if self.type is ResourceType.ANY:
            return "*"
        if self.pattern is ResourcePattern.ANY:
            return f"{self.type.value}:*"
        if self.pattern is ResourcePattern.PREFIXED:
            return f"{self.type.value}:{self.name}*"
        return f"{self.type.value}:{self.name}"

    def matches(self, requested: Resource) -> bool:
        if self.type is ResourceType.ANY:
            return True
        if self.type is not requested.type:
            return False
        if self.pattern is ResourcePattern.ANY:
            return True
        if self.pattern is ResourcePattern.PREFIXED:
            return (requested.name or "").startswith(self.name or "")
        return requested.name == self.name

    def specificity(self) -> tuple[int, int, int]:
        """Sorts the most specific first."""
        type_rank = 1 if self.type is ResourceType.ANY else 0
        pattern_rank = {ResourcePattern.LITERAL: 0, ResourcePattern.PREFIXED: 1, ResourcePattern.ANY: 2}[self.pattern]
        return type_rank, pattern_rank, -len(self.name or "")


def parse_actions(texts: Iterable[str]) -> tuple[Action, ...]:
    actions = tuple(by_name(Action, t, "action") for t in texts if t.strip())
    if not actions:
        raise AclError("no action given: Pub, Sub, Create, Update, Delete, Get, List or All")
    if Action.ANY in actions:
        raise AclError("Any is what a request asks, not a rule's action: write All")
    return actions


def parse_source_ips(texts: Iterable[str]) -> tuple[str, ...]:
    out = []
    for text in texts:
        text = text.strip()
        if not text:
            continue
        try:
            out.append(str(ipaddress.ip_network(text, strict=False)))
        except ValueError:
            raise AclError(f"source IP {text!r} is not an address or a CIDR range (10.0.0.0/8)") from None
    return tuple(out)


@dataclass(frozen=True)
class PolicyEntry:
    resource: Resource
    actions: tuple[Action, ...]
    source_ips: tuple[str, ...] = ()
    decision: Decision = Decision.ALLOW
    _networks: tuple[Any, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_networks", tuple(ipaddress.ip_network(ip) for ip in self.source_ips))

    def matches(self, resource: Resource, actions: Sequence[Action], source_ip: str) -> bool:
        if not self.resource.matches(resource):
            return False
        if Action.ANY not in actions and Action.ALL not in self.actions and \
                not any(a in self.actions for a in actions):
            return False
        if not self._networks:
            return True
        try:
            address = ipaddress.ip_address(source_ip)
        except ValueError:
            return False
        return any(address in network for network in self._networks)

    def sort_key(self) -> tuple[int, int, int, int]:
        return (*self.resource.specificity(), 0 if self.decision is Decision.DENY else 1)

    def to_json(self) -> dict[str, Any]:
        return {"actions": [a.value for a in self.actions], "decision": self.decision.value,
                "resource": self.resource.key, "sourceIps": list(self.source_ips)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PolicyEntry:
        return cls(Resource.parse(str(data["resource"])), parse_actions(data["actions"]),
                   parse_source_ips(data.get("sourceIps") or ()),
                   by_name(Decision, str(data.get("decision", "Allow")), "decision"))


@dataclass
class Acl:
    """A subject's rules: at most one entry per resource (a new one for the same resource replaces it)."""

    subject: str
    entries: list[PolicyEntry]

    def put(self, entries: Iterable[PolicyEntry]) -> None:
        for entry in entries:
            self.entries = [e for e in self.entries if e.resource != entry.resource] + [entry]

    def decide(self, resource: Resource, actions: Sequence[Action], source_ip: str) -> PolicyEntry | None:
        """The entry that decides the request, or None when none matches it."""
        matched = [e for e in self.entries if e.matches(resource, actions, source_ip)]
        return min(matched, key=PolicyEntry.sort_key) if matched else None

    def to_json(self) -> dict[str, Any]:
        return {"policies": [{"entries": [e.to_json() for e in self.entries], "policyType": "Custom"}],
                "subject": self.subject}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Acl:
        entries = [PolicyEntry.from_json(e) for p in data.get("policies") or () for e in p.get("entries") or ()]
        return cls(str(data["subject"]), entries)
