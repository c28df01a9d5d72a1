"""The refusals of the wire format (docs/WIRE.md, "Hostile input: limits and refusal reasons")."""

from __future__ import annotations

# Reasons a message is refused; Subscriber.stats counts by these. docs/WIRE.md lists them.
REASONS = ("too_large", "frames", "topic", "header", "schema", "version", "field", "parts", "shape", "dtype",
           "encoding", "image")


class WireError(ValueError):
    """A message does not follow the wire format; ``reason`` is one of REASONS."""

    reason = "field"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class MessageTooLarge(WireError):
    """A message (or a decoded part) is larger than the receiver's limit."""

    reason = "too_large"


class SchemaVersionError(WireError):
    """The publisher speaks another major version of the schema."""

    reason = "version"
