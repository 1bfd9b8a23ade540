"""How big a chunk to take next, and how long to linger for it: adapted to the load.

A chunked consumer records each chunk in one transaction. Under load, larger chunks
mean fewer transactions per row (and fewer updates of each job's counter row); when
quiet, a short linger keeps the latency of a lone message low. :class:`ChunkPace` keeps
both from what the previous chunk showed, within fixed bounds (messages, and the
caller's byte bound, which it never changes):

- size: starts at ``base`` messages; doubles (up to ``most``) when a chunk was full and
  the load is high (messages were still waiting after it, or its transaction took at
  least the longest linger); halves back (down to ``base``) when a chunk was at most
  half full; never above the caller's ``ceiling`` for it (what the consumers that
  delivered the chunk may hold together: a larger chunk could not fill), nor below
  ``base``;
- linger: starts at ``linger_s`` (as a fixed linger would); halves (down to
  ``min_linger_s``) when a chunk was a lone message: lingering gained nothing; doubles
  (up to ``linger_s``) when more than one message arrived for a chunk or messages were
  still waiting;
- :meth:`ChunkPace.reset` after a chunk that failed: back to ``base`` and ``linger_s``
  (the requeued backlog says nothing of the load, and a chunk that failed because of its
  size must not be retried larger).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_LINGER_S = 0.001


@dataclass
class ChunkPace:
    """The next chunk's size (messages) and linger (seconds), adapted by :meth:`observe`."""

    base: int
    most: int
    linger_s: float
    min_linger_s: float = MIN_LINGER_S
    size: int = field(init=False)
    linger: float = field(init=False)

    def __post_init__(self) -> None:
        self.most = max(self.most, self.base)
        self.min_linger_s = min(self.min_linger_s, self.linger_s)
        self.size = self.base
        self.linger = self.linger_s

    def reset(self) -> None:
        """Back to the starting size and linger (after a failed chunk)."""
        self.size = self.base
        self.linger = self.linger_s

    def observe(
        self, taken: int, waiting: int, elapsed_s: float, ceiling: int | None = None
    ) -> None:
        """Adapt to a chunk of ``taken`` messages that left ``waiting`` behind in the
        inbox and whose handling took ``elapsed_s``; the size stays within ``ceiling``
        (when given, and never below ``base``)."""
        if taken >= self.size and (waiting > 0 or elapsed_s >= self.linger_s):
            self.size = min(self.most, self.size * 2)
        elif taken * 2 <= self.size:
            self.size = max(self.base, self.size // 2)
        if ceiling is not None:
            self.size = max(self.base, min(self.size, ceiling))
        if taken > 1 or waiting > 0:
            self.linger = min(self.linger_s, self.linger * 2)
        else:
            self.linger = max(self.min_linger_s, self.linger / 2)
