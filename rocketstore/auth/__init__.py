"""ACL 2.0 of RocketMQ 5.3: signatures (``signature``), users and rules (``model``), and their durable
tables (``metadata``). The gateway enforces them (``services/gateway/access.py``)."""

from .model import Acl, AclError, Action, Decision, PolicyEntry, Resource, User, UserStatus, UserType
from .signature import Credentials, SignatureError, signed_metadata

__all__ = ["Acl", "AclError", "Action", "Credentials", "Decision", "PolicyEntry", "Resource", "SignatureError",
           "User", "UserStatus", "UserType", "signed_metadata"]
