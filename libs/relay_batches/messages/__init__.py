"""Every bus message, one frozen dataclass per kind, with versioned orjson encode/decode:
the envelope (:mod:`~relay_batches.messages.codec`), the messages that carry rows
(:mod:`~relay_batches.messages.rows`) and those that steer work
(:mod:`~relay_batches.messages.control`).

A message that does not decode (bad JSON, wrong version, missing field) raises
:class:`MessageError`; consumers reject such a message without requeue.
"""

from __future__ import annotations

from relay_batches.messages.codec import (
    SCHEMA_VERSION,
    MessageError,
)
from relay_batches.messages.control import (
    DispatchWakeup,
    GrantMessage,
    HeldRows,
    HoldingReport,
    JobEvent,
    TemplateCreated,
    ThrottledEvent,
)
from relay_batches.messages.rows import (
    UNPAUSED,
    DecodedSlice,
    OutcomesMessage,
    RowOutcome,
    RowRequest,
    SliceMessage,
    SliceRow,
    request_json,
    row_request,
)

__all__ = [
    "SCHEMA_VERSION",
    "UNPAUSED",
    "DecodedSlice",
    "DispatchWakeup",
    "GrantMessage",
    "HeldRows",
    "HoldingReport",
    "JobEvent",
    "MessageError",
    "OutcomesMessage",
    "RowOutcome",
    "RowRequest",
    "SliceMessage",
    "SliceRow",
    "TemplateCreated",
    "ThrottledEvent",
    "request_json",
    "row_request",
]
