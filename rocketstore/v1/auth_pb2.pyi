from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UserInfo(_message.Message):
    __slots__ = ("username", "password", "user_type", "user_status")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    USER_TYPE_FIELD_NUMBER: _ClassVar[int]
    USER_STATUS_FIELD_NUMBER: _ClassVar[int]
    username: str
    password: str
    user_type: str
    user_status: str
    def __init__(self, username: _Optional[str] = ..., password: _Optional[str] = ..., user_type: _Optional[str] = ..., user_status: _Optional[str] = ...) -> None: ...

class DeleteUserRequest(_message.Message):
    __slots__ = ("username",)
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    username: str
    def __init__(self, username: _Optional[str] = ...) -> None: ...

class DeleteUserResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetUserRequest(_message.Message):
    __slots__ = ("username",)
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    username: str
    def __init__(self, username: _Optional[str] = ...) -> None: ...

class ListUsersRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: str
    def __init__(self, filter: _Optional[str] = ...) -> None: ...

class ListUsersResponse(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[UserInfo]
    def __init__(self, users: _Optional[_Iterable[_Union[UserInfo, _Mapping]]] = ...) -> None: ...

class PolicyEntryInfo(_message.Message):
    __slots__ = ("resource", "actions", "source_ips", "decision")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_IPS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    resource: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    source_ips: _containers.RepeatedScalarFieldContainer[str]
    decision: str
    def __init__(self, resource: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ..., source_ips: _Optional[_Iterable[str]] = ..., decision: _Optional[str] = ...) -> None: ...

class AclInfo(_message.Message):
    __slots__ = ("subject", "entries")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    subject: str
    entries: _containers.RepeatedCompositeFieldContainer[PolicyEntryInfo]
    def __init__(self, subject: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[PolicyEntryInfo, _Mapping]]] = ...) -> None: ...

class DeleteAclRequest(_message.Message):
    __slots__ = ("subject", "resources")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    subject: str
    resources: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subject: _Optional[str] = ..., resources: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteAclResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetAclRequest(_message.Message):
    __slots__ = ("subject",)
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    subject: str
    def __init__(self, subject: _Optional[str] = ...) -> None: ...

class ListAclsRequest(_message.Message):
    __slots__ = ("subject_filter", "resource_filter")
    SUBJECT_FILTER_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FILTER_FIELD_NUMBER: _ClassVar[int]
    subject_filter: str
    resource_filter: str
    def __init__(self, subject_filter: _Optional[str] = ..., resource_filter: _Optional[str] = ...) -> None: ...

class ListAclsResponse(_message.Message):
    __slots__ = ("acls",)
    ACLS_FIELD_NUMBER: _ClassVar[int]
    acls: _containers.RepeatedCompositeFieldContainer[AclInfo]
    def __init__(self, acls: _Optional[_Iterable[_Union[AclInfo, _Mapping]]] = ...) -> None: ...
