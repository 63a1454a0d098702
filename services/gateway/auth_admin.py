"""``rocketstore.v1.AuthAdmin``: users and ACL rules managed through the gateway (``rocketstore user ...``,
``rocketstore acl ...``). Thin: the tables are ``rocketstore.auth.metadata.AuthMetadata``; who may call is
the access interceptor's (super users once authentication is on)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import grpc.aio

from rocketstore.auth.model import (
    Acl,
    AclError,
    Decision,
    PolicyEntry,
    Resource,
    User,
    UserStatus,
    UserType,
    by_name,
    parse_actions,
    parse_source_ips,
)
from rocketstore.rpc.servicing import rpc_errors
from rocketstore.v1 import auth_pb2 as pb
from rocketstore.v1 import auth_pb2_grpc as pb_grpc

from .access import AccessControl
from .errors import GatewayError

__all__ = ["AUTH_ADMIN_SERVICE", "AuthAdminServicer"]

AUTH_ADMIN_SERVICE = "rocketstore.v1.AuthAdmin"

_Context = grpc.aio.ServicerContext[Any, Any]
_R = TypeVar("_R")


def _user_info(user: User) -> pb.UserInfo:
    return pb.UserInfo(username=user.username, user_type=user.user_type.value, user_status=user.user_status.value)


def _acl_info(acl: Acl, resource_filter: str = "") -> pb.AclInfo:
    return pb.AclInfo(subject=acl.subject, entries=[
        pb.PolicyEntryInfo(resource=e.resource.key, actions=[a.value for a in e.actions], source_ips=e.source_ips,
                           decision=e.decision.value)
        for e in acl.entries if resource_filter in e.resource.key])


def _entries(request: pb.AclInfo) -> list[PolicyEntry]:
    return [PolicyEntry(Resource.parse(e.resource), parse_actions(e.actions), parse_source_ips(e.source_ips),
                        by_name(Decision, e.decision or "Allow", "decision"))
            for e in request.entries]


class AuthAdminServicer(pb_grpc.AuthAdminServicer):
    def __init__(self, access: AccessControl) -> None:
        self._access = access
        self._tables = access.metadata

    async def _run(self, change: Callable[[], _R]) -> _R:
        """A change of the tables (a file written and fsynced: off the event loop), then the caches dropped."""
        try:
            return await asyncio.to_thread(change)
        except AclError as e:
            raise GatewayError(e.code, str(e)) from None
        finally:
            self._access.changed()

    @rpc_errors
    async def CreateUser(self, request: pb.UserInfo, context: _Context) -> pb.UserInfo:
        def create() -> User:
            return self._tables.create_user(User(
                request.username, request.password,
                by_name(UserType, request.user_type or "Normal", "user type"),
                by_name(UserStatus, request.user_status or "enable", "user status")))
        return _user_info(await self._run(create))

    @rpc_errors
    async def UpdateUser(self, request: pb.UserInfo, context: _Context) -> pb.UserInfo:
        def update() -> User:
            return self._tables.update_user(
                request.username, request.password or None,
                by_name(UserType, request.user_type, "user type") if request.user_type else None,
                by_name(UserStatus, request.user_status, "user status") if request.user_status else None)
        return _user_info(await self._run(update))

    @rpc_errors
    async def DeleteUser(self, request: pb.DeleteUserRequest, context: _Context) -> pb.DeleteUserResponse:
        await self._run(lambda: self._tables.delete_user(request.username))
        return pb.DeleteUserResponse()

    @rpc_errors
    async def GetUser(self, request: pb.GetUserRequest, context: _Context) -> pb.UserInfo:
        user = self._tables.user(request.username)
        if user is None:
            raise GatewayError("NOT_FOUND", f"user {request.username!r} does not exist")
        return _user_info(user)

    @rpc_errors
    async def ListUsers(self, request: pb.ListUsersRequest, context: _Context) -> pb.ListUsersResponse:
        users = self._tables.users
        return pb.ListUsersResponse(users=[_user_info(users[name]) for name in sorted(users)
                                           if request.filter in name])

    @rpc_errors
    async def CreateAcl(self, request: pb.AclInfo, context: _Context) -> pb.AclInfo:
        return await self._put(request, must_exist=False)

    @rpc_errors
    async def UpdateAcl(self, request: pb.AclInfo, context: _Context) -> pb.AclInfo:
        return await self._put(request, must_exist=True)

    async def _put(self, request: pb.AclInfo, *, must_exist: bool) -> pb.AclInfo:
        def put() -> Acl:
            return self._tables.put_acl(request.subject, _entries(request), must_exist=must_exist)
        return _acl_info(await self._run(put))

    @rpc_errors
    async def DeleteAcl(self, request: pb.DeleteAclRequest, context: _Context) -> pb.DeleteAclResponse:
        await self._run(lambda: self._tables.delete_acl(request.subject, request.resources))
        return pb.DeleteAclResponse()

    @rpc_errors
    async def GetAcl(self, request: pb.GetAclRequest, context: _Context) -> pb.AclInfo:
        acl = self._tables.acl(request.subject)
        if acl is None:
            raise GatewayError("NOT_FOUND", f"{request.subject} has no ACL")
        return _acl_info(acl)

    @rpc_errors
    async def ListAcls(self, request: pb.ListAclsRequest, context: _Context) -> pb.ListAclsResponse:
        acls = self._tables.acls
        found = [_acl_info(acls[s], request.resource_filter) for s in sorted(acls) if request.subject_filter in s]
        return pb.ListAclsResponse(acls=[a for a in found if a.entries])
