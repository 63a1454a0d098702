"""Users and ACL rules of a broker (``rocketstore.v1.AuthAdmin``): what ``rocketstore user`` and
``rocketstore acl`` call. Once the broker requires authentication, only a super user's credentials may."""

from __future__ import annotations

from collections.abc import Sequence

from rocketstore.rpc.tls import ClientTls
from rocketstore.v1 import auth_pb2 as pb
from rocketstore.v1 import auth_pb2_grpc

from .connection import DEFAULT_TIMEOUT, Connection, split_endpoints
from .signing import Credentials

__all__ = ["AuthAdmin"]


class AuthAdmin:
    """Every method raises the ClientError of the gateway's status (NotFoundError for an unknown user,
    PermissionDeniedError for a caller that is not a super user, ...)."""

    def __init__(self, endpoint: str, *, timeout: float = DEFAULT_TIMEOUT, tls: ClientTls | None = None,
                 credentials: Credentials | None = None) -> None:
        self._conn = Connection(split_endpoints(endpoint)[0], timeout, send_stream=False, tls=tls,
                                credentials=credentials)
        self._stub = auth_pb2_grpc.AuthAdminStub(self._conn.channel)

    def __enter__(self) -> AuthAdmin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    # --- users -----------------------------------------------------------------------------
    def create_user(self, username: str, password: str, user_type: str = "Normal") -> pb.UserInfo:
        return self._conn.call(self._stub.CreateUser, pb.UserInfo(username=username, password=password,
                                                                  user_type=user_type))

    def update_user(self, username: str, *, password: str = "", user_type: str = "",
                    user_status: str = "") -> pb.UserInfo:
        return self._conn.call(self._stub.UpdateUser, pb.UserInfo(username=username, password=password,
                                                                  user_type=user_type, user_status=user_status))

    def delete_user(self, username: str) -> None:
        self._conn.call(self._stub.DeleteUser, pb.DeleteUserRequest(username=username))

    def get_user(self, username: str) -> pb.UserInfo:
        return self._conn.call(self._stub.GetUser, pb.GetUserRequest(username=username))

    def list_users(self, filter: str = "") -> list[pb.UserInfo]:  # noqa: A002 - mqadmin's name
        return list(self._conn.call(self._stub.ListUsers, pb.ListUsersRequest(filter=filter)).users)

    # --- ACLs ------------------------------------------------------------------------------
    def create_acl(self, subject: str, resources: Sequence[str], actions: Sequence[str], decision: str = "Allow",
                   source_ips: Sequence[str] = (), *, update: bool = False) -> pb.AclInfo:
        """One entry per resource, each with the same actions, source IPs and decision (mqadmin createAcl)."""
        request = pb.AclInfo(subject=subject, entries=[
            pb.PolicyEntryInfo(resource=r, actions=actions, source_ips=source_ips, decision=decision)
            for r in resources])
        return self._conn.call(self._stub.UpdateAcl if update else self._stub.CreateAcl, request)

    def delete_acl(self, subject: str, resources: Sequence[str] = ()) -> None:
        self._conn.call(self._stub.DeleteAcl, pb.DeleteAclRequest(subject=subject, resources=resources))

    def get_acl(self, subject: str) -> pb.AclInfo:
        return self._conn.call(self._stub.GetAcl, pb.GetAclRequest(subject=subject))

    def list_acls(self, subject_filter: str = "", resource_filter: str = "") -> list[pb.AclInfo]:
        return list(self._conn.call(self._stub.ListAcls, pb.ListAclsRequest(
            subject_filter=subject_filter, resource_filter=resource_filter)).acls)
