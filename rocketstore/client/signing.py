"""Signed calls: every call of a client with credentials carries RocketMQ 5's ``authorization`` and
``x-mq-date-time`` headers (``rocketstore/auth/signature.py``), signed at the moment it is made.

Credentials come from the client's ``credentials`` argument, else from the environment:
``ROCKETSTORE_ACCESS_KEY`` and ``ROCKETSTORE_SECRET_KEY`` (how the CLI and Spark's readers get them)."""

from __future__ import annotations

import collections
import os
from typing import Any

import grpc

from rocketstore.auth.signature import Credentials, signed_metadata

__all__ = ["ACCESS_KEY_ENV", "SECRET_KEY_ENV", "Credentials", "credentials_from_env", "signed_channel"]

ACCESS_KEY_ENV = "ROCKETSTORE_ACCESS_KEY"
SECRET_KEY_ENV = "ROCKETSTORE_SECRET_KEY"


def credentials_from_env(environ: os._Environ[str] | dict[str, str] | None = None) -> Credentials | None:
    env = os.environ if environ is None else environ
    access_key, secret_key = env.get(ACCESS_KEY_ENV, ""), env.get(SECRET_KEY_ENV, "")
    if not access_key and not secret_key:
        return None
    if not access_key or not secret_key:
        raise ValueError(f"{ACCESS_KEY_ENV} and {SECRET_KEY_ENV} go together: one of them is empty")
    return Credentials(access_key, secret_key)


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                           "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class _Signer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
              grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def _signed(self, details: Any) -> _CallDetails:
        metadata = [*(details.metadata or ()), *signed_metadata(self._credentials)]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._signed(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._signed(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._signed(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._signed(details), requests)


def signed_channel(channel: grpc.Channel, credentials: Credentials | None) -> grpc.Channel:
    """``channel`` whose calls are signed with ``credentials`` (unchanged when None)."""
    if credentials is None:
        return channel
    return grpc.intercept_channel(channel, _Signer(credentials))
