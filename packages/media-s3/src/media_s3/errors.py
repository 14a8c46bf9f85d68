"""Errors raised by `S3MediaStore` when the bucket, the credentials or the endpoint are at fault.

They wrap botocore's exceptions (kept as `__cause__`) with a message that names the bucket and
the endpoint and says what to check. No message ever contains a secret key or session token.
"""

from __future__ import annotations

__all__ = (
    'S3AccessDeniedError',
    'S3BucketNotFoundError',
    'S3EndpointUnreachableError',
    'S3MediaError',
)


class S3MediaError(RuntimeError):
    """An S3 request of an `S3MediaStore` failed; `bucket` and `endpoint` say where it went."""

    def __init__(self, message: str, *, bucket: str, endpoint: str) -> None:
        super().__init__(message)
        self.bucket = bucket
        self.endpoint = endpoint


class S3BucketNotFoundError(S3MediaError):
    """The configured bucket does not exist at the endpoint."""


class S3AccessDeniedError(S3MediaError):
    """The endpoint refused the credentials (unknown key, bad signature, expired token, no permission)."""


class S3EndpointUnreachableError(S3MediaError, ConnectionError):
    """No connection to the endpoint could be made, or it timed out."""
