"""Users and ACLs, durable in the config directory: ``users.json`` and ``acls.json``.

The one home of their format. Each change rewrites its file atomically (``persist_json``: temporary file,
fsync, rename, the previous version kept as ``.bak``), readable by its owner only (it holds secret keys, as
RocketMQ's metadata store does: HMAC needs them). A slave receives both files with the broker's other
config files (``services/ha/config_sync.py``), and a process that does not write them (a front gateway, a
slave's gateway) picks up a replaced file with ``reload_if_changed``. ``generation`` grows with every
change, so caches built from these tables know when to drop what they hold.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from rocketstore.config.config_file import file_stamp, load_json, persist_json
from rocketstore.log import get_logger

from .model import Acl, AclError, PolicyEntry, User, UserStatus, UserType, subject_of

__all__ = ["ACLS_FILE", "USERS_FILE", "AuthMetadata"]

USERS_FILE = "users.json"
ACLS_FILE = "acls.json"

_log = get_logger("rocketstore.auth")


def _decode_users(data: dict[str, Any]) -> dict[str, User]:
    users = [User.from_json(u) for u in data.get("users") or ()]
    return {u.username: u for u in users}


def _decode_acls(data: dict[str, Any]) -> dict[str, Acl]:
    acls = [Acl.from_json(a) for a in data.get("acls") or ()]
    return {a.subject: a for a in acls}


class AuthMetadata:
    """The tables, loaded from ``config_dir``; changes are written at once (under one lock)."""

    def __init__(self, config_dir: str) -> None:
        self.config_dir = config_dir
        self.users_path = os.path.join(config_dir, USERS_FILE)
        self.acls_path = os.path.join(config_dir, ACLS_FILE)
        self._lock = threading.Lock()
        self.generation = 0
        self.users: dict[str, User] = {}
        self.acls: dict[str, Acl] = {}
        self._stamps: tuple[Any, Any] = (None, None)
        self.reload_if_changed()

    # --- reading ---------------------------------------------------------------------------------
    def reload_if_changed(self) -> bool:
        """Load both files again if another process replaced either; True if it did. A file that does not
        load raises (``ConfigFileError``) and leaves the tables as they were."""
        stamps = (file_stamp(self.users_path), file_stamp(self.acls_path))
        if stamps == self._stamps:
            return False
        with self._lock:
            users = load_json(self.users_path, check=_decode_users)
            acls = load_json(self.acls_path, check=_decode_acls)
            self.users = _decode_users(users) if users is not None else {}
            self.acls = _decode_acls(acls) if acls is not None else {}
            self._stamps = stamps
            self.generation += 1
        return True

    def user(self, username: str) -> User | None:
        return self.users.get(username)

    def acl(self, subject: str) -> Acl | None:
        return self.acls.get(subject)

    # --- users -----------------------------------------------------------------------------------
    def create_user(self, user: User) -> User:
        def change(users: dict[str, User]) -> None:
            if user.username in users:
                raise AclError(f"user {user.username!r} already exists", "ALREADY_EXISTS")
            users[user.username] = user
        self._change_users(change)
        return user

    def ensure_super_user(self, username: str, password: str) -> bool:
        """RocketMQ's ``initUser``: create a super user unless one of that name exists; True if created."""
        if username in self.users:
            return False
        self.create_user(User(username, password, UserType.SUPER))
        return True

    def update_user(self, username: str, password: str | None = None, user_type: UserType | None = None,
                    user_status: UserStatus | None = None) -> User:
        updated: list[User] = []

        def change(users: dict[str, User]) -> None:
            old = users.get(username)
            if old is None:
                raise AclError(f"user {username!r} does not exist", "NOT_FOUND")
            new = User(username, password or old.password, user_type or old.user_type, user_status or old.user_status)
            users[username] = new
            updated.append(new)
        self._change_users(change)
        return updated[0]

    def delete_user(self, username: str) -> None:
        """The user and its ACL."""
        def change(users: dict[str, User]) -> None:
            if users.pop(username, None) is None:
                raise AclError(f"user {username!r} does not exist", "NOT_FOUND")
        self._change_users(change)
        if subject_of(username) in self.acls:
            self.delete_acl(subject_of(username))

    # --- ACLs ------------------------------------------------------------------------------------
    def put_acl(self, subject: str, entries: Iterable[PolicyEntry], *, must_exist: bool) -> Acl:
        """Add ``entries`` to the subject's ACL (an entry replaces the one of the same resource); the ACL is
        created unless ``must_exist``. The subject must be a known user."""
        entries = list(entries)
        if not entries:
            raise AclError("no rule given: name at least one resource")
        username = _username(subject)
        if username not in self.users:
            raise AclError(f"user {username!r} does not exist: create it first", "NOT_FOUND")
        result: list[Acl] = []

        def change(acls: dict[str, Acl]) -> None:
            acl = acls.get(subject)
            if acl is None:
                if must_exist:
                    raise AclError(f"{subject} has no ACL to update", "NOT_FOUND")
                acl = Acl(subject, [])
            copy = Acl(subject, list(acl.entries))
            copy.put(entries)
            acls[subject] = copy
            result.append(copy)
        self._change_acls(change)
        return result[0]

    def delete_acl(self, subject: str, resources: Iterable[str] = ()) -> None:
        """The subject's whole ACL, or its entries of ``resources`` (keys such as ``Topic:orders``)."""
        keys = set(resources)

        def change(acls: dict[str, Acl]) -> None:
            acl = acls.get(subject)
            if acl is None:
                raise AclError(f"{subject} has no ACL", "NOT_FOUND")
            if not keys:
                del acls[subject]
                return
            missing = keys - {e.resource.key for e in acl.entries}
            if missing:
                raise AclError(f"{subject} has no rule for {', '.join(sorted(missing))}", "NOT_FOUND")
            acls[subject] = Acl(subject, [e for e in acl.entries if e.resource.key not in keys])
        self._change_acls(change)

    # --- writing ---------------------------------------------------------------------------------
    def _change_users(self, change: Callable[[dict[str, User]], None]) -> None:
        with self._lock:
            users = dict(self.users)
            change(users)
            _persist(self.users_path, {"users": [users[k].to_json() for k in sorted(users)]})
            self.users = users
            self._stamps = (file_stamp(self.users_path), self._stamps[1])
            self.generation += 1
        _log.info("users changed", path=self.users_path, users=len(users))

    def _change_acls(self, change: Callable[[dict[str, Acl]], None]) -> None:
        with self._lock:
            acls = dict(self.acls)
            change(acls)
            _persist(self.acls_path, {"acls": [acls[k].to_json() for k in sorted(acls)]})
            self.acls = acls
            self._stamps = (self._stamps[0], file_stamp(self.acls_path))
            self.generation += 1
        _log.info("acls changed", path=self.acls_path, subjects=len(acls))


def _username(subject: str) -> str:
    kind, colon, name = subject.partition(":")
    if kind != "User" or not colon or not name:
        raise AclError(f"subject {subject!r} is not User:<username>")
    return name


def _persist(path: str, data: object) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    persist_json(path, data)
    for name in (path, path + ".bak"):  # secret keys: the files are the broker's only
        if os.path.exists(name):
            os.chmod(name, 0o600)
