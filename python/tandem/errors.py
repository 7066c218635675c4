"""Errors of Tandem's services as Python exceptions, with their structured details.

Tandem's services attach a google.rpc.Status to an error's trailing metadata
(grpc-status-details-bin): google.rpc.BadRequest names each wrong field, google.rpc.ErrorInfo
gives a stable reason (e.g. JOB_NOT_FOUND). Debian ships no grpcio-status, so the status is
decoded here from the trailer with the stubs generated from the vendored protos.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import grpc
from google.protobuf import message

from google.rpc import error_details_pb2, status_pb2

_DETAILS_KEY = "grpc-status-details-bin"


@dataclasses.dataclass(frozen=True)
class FieldViolation:
    """A wrong field of a request: its path (e.g. "spec.group_size") and why."""

    field: str
    description: str


class TandemError(Exception):
    """A call to a Tandem service failed.

    code: the gRPC status code; message: the service's message; reason and domain: the
    ErrorInfo's stable reason (empty when the service gave none); field_violations: the
    BadRequest's fields (empty when none).
    """

    def __init__(self, code: grpc.StatusCode, message: str, *, reason: str = "",
                 domain: str = "", metadata: Optional[Dict[str, str]] = None,
                 field_violations: Optional[List[FieldViolation]] = None):
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata = dict(metadata or {})
        self.field_violations = list(field_violations or [])
        super().__init__(self._describe())

    def _describe(self) -> str:
        text = f"{self.code.name}: {self.message}"
        if self.reason:
            text += f" [{self.reason}]"
        return text

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "TandemError":
        """The exception for a failed call, with the details its trailers carry."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        message = error.details() if hasattr(error, "details") else str(error)
        status = _status_of(error)
        if status is None:
            return cls(code, message or "")
        fields = dict(reason="", domain="", metadata={}, field_violations=[])
        for detail in status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad_request = error_details_pb2.BadRequest()
                detail.Unpack(bad_request)
                fields["field_violations"] += [FieldViolation(v.field, v.description)
                                               for v in bad_request.field_violations]
            elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                fields.update(reason=info.reason, domain=info.domain, metadata=dict(info.metadata))
        return cls(code, status.message or message or "", **fields)


def _status_of(error: grpc.RpcError) -> Optional[status_pb2.Status]:
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == _DETAILS_KEY:
            status = status_pb2.Status()
            try:
                status.ParseFromString(value)
            except message.DecodeError:  # A malformed trailer leaves the plain error.
                return None
            return status
    return None
