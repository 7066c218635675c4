"""One service's channel: TLS, the bearer token and deadlines, and errors as TandemError."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable, Iterator, Optional, Union

import grpc

from tandem.errors import TandemError


@dataclasses.dataclass(frozen=True)
class Tls:
    """TLS to the services (the chart's and the services' --tls_* flags).

    ca: PEM file of the CA that signed the servers (None: the system's roots); cert and key:
    PEM files of a client certificate, for servers that require one (mTLS); server_name: the
    name to verify instead of the target's host (e.g. when dialing an IP address).
    """

    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert is None) != (self.key is None):
            raise ValueError("Tls needs both cert and key, or neither")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca), private_key=_read(self.key),
            certificate_chain=_read(self.cert))


TlsLike = Union[None, bool, Tls]


def _read(path: Optional[str]) -> Optional[bytes]:
    return None if path is None else pathlib.Path(path).read_bytes()


class Connection:
    """Calls on one channel; every call carries the token and a deadline (streams: none unless
    given), and a failure raises TandemError with the status details."""

    def __init__(self, target: str, *, token: Optional[str], tls: TlsLike, timeout: float):
        self.target = target
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        options = [("grpc.max_receive_message_length", 64 << 20)]
        if tls is None or tls is False:
            self.channel = grpc.insecure_channel(target, options=options)
            return
        tls = Tls() if tls is True else tls
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        self.channel = grpc.secure_channel(target, tls.credentials(), options=options)

    def call(self, method: Callable[..., Any], request: Any) -> Any:
        """A unary call."""
        try:
            return method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise TandemError.from_rpc_error(error) from None

    def stream(self, method: Callable[..., Any], request: Any,
               timeout: Optional[float] = None) -> Iterator[Any]:
        """A server-streaming call's messages; the call ends when the iterator is closed."""
        responses = method(request, timeout=timeout, metadata=self._metadata)
        try:
            yield from responses
        except grpc.RpcError as error:
            raise TandemError.from_rpc_error(error) from None
        finally:
            responses.cancel()

    def close(self) -> None:
        self.channel.close()
