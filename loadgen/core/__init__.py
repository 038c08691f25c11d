"""The sans-IO streaming core shared by every driver: standard library only, no clock, no I/O.

A driver feeds ``StreamTracker.feed(bytes, now_ns)`` and calls ``finish``; everything else is parsing.
"""

from loadgen.core.records import CHUNK_COLUMNS, REQUEST_COLUMNS, ChunkRecord, ErrorKind, RequestRecord
from loadgen.core.sse import SseDecoder
from loadgen.core.tracker import RequestMeta, StreamTracker, error_kind_for_status

__all__ = ["CHUNK_COLUMNS", "REQUEST_COLUMNS", "ChunkRecord", "ErrorKind", "RequestRecord", "SseDecoder",
           "RequestMeta", "StreamTracker", "error_kind_for_status"]
