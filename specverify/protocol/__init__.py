"""The packed speculative logprob message (docs/protocol.md): capacities, header packing, the
sender `MessageWriter` and the receiver `read_message`."""

from specverify.protocol.message import (
    CHUNKED_PREFILL,
    DEFAULT_CAPACITY,
    DRAFT_TOKENS,
    PREEMPTED,
    RECOVERY_STOP,
    SIGNAL_COUNTS,
    TARGET_TOKENS,
    Capacity,
    MalformedMessage,
    Message,
    MessageWriter,
    pack_header,
    read_message,
    unpack_header,
)

__all__ = [
    "CHUNKED_PREFILL",
    "DEFAULT_CAPACITY",
    "DRAFT_TOKENS",
    "PREEMPTED",
    "RECOVERY_STOP",
    "SIGNAL_COUNTS",
    "TARGET_TOKENS",
    "Capacity",
    "MalformedMessage",
    "Message",
    "MessageWriter",
    "pack_header",
    "read_message",
    "unpack_header",
]
