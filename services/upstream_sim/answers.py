"""What the simulator was paid for: each distinct request counted by the calls it
answered (a 200 whose answer the simulator finished) and by the calls it began.

``GET /stats/answers`` serves :meth:`AnswerCounts.summary`. A request is known by its
model and the contents of its messages (hashed: 16 bytes a request), so the rows of a
test batch, whose contents differ, are counted one by one: ``extra_answers`` is how
many answered calls were paid for a second (or third) time, ``rows_answered_twice``
how many requests that concerns, and ``extra_begun`` the same over the calls begun
(a call cut off by its client, e.g. a row-worker killed mid-call, is begun but never
answered; a provider may bill it anyway). ``repeated_first_answered_at`` says when each
request answered twice was first answered.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # echo imports the state, which holds these counts
    from relay_batches.services.upstream_sim.echo import ChatRequest

MAX_TRACKED = 2_000_000  # distinct requests remembered (~200 MB at most); then no new ones
MAX_REPEATS_LISTED = 1_000


def request_key(chat: ChatRequest) -> bytes:
    """The identity of a request: its model and every message's content."""
    digest = hashlib.blake2b(chat.model.encode(), digest_size=16)
    for content in chat.contents:
        digest.update(b"\x00")
        digest.update(content.encode())
    return digest.digest()


class AnswerCounts:
    """Calls begun and answered per distinct request, up to ``capacity`` requests."""

    def __init__(self, capacity: int = MAX_TRACKED, clock: Callable[[], float] = time.time) -> None:
        self._capacity = capacity
        self._clock = clock
        self.begun: Counter[bytes] = Counter()
        self.answered: Counter[bytes] = Counter()
        self._first: dict[bytes, float] = {}  # each request's first answer, Unix seconds

    def begin(self, chat: ChatRequest) -> None:
        """Count a call of ``chat`` that the simulator starts to answer."""
        self._count(self.begun, request_key(chat))

    def answer(self, chat: ChatRequest) -> None:
        """Count a call of ``chat`` answered with a 200 (the first one's time noted)."""
        key = request_key(chat)
        self._count(self.answered, key)
        if key in self.answered:
            self._first.setdefault(key, self._clock())

    def _count(self, counts: Counter[bytes], key: bytes) -> None:
        if key in counts or len(counts) < self._capacity:
            counts[key] += 1

    def summary(self) -> dict[str, object]:
        """The counts served by ``GET /stats/answers``."""
        answers = sum(self.answered.values())
        begun = sum(self.begun.values())
        return {
            "requests_answered": len(self.answered),
            "answers": answers,
            "extra_answers": answers - len(self.answered),
            "rows_answered_twice": sum(1 for n in self.answered.values() if n > 1),
            "most_answers": max(self.answered.values(), default=0),
            "requests_begun": len(self.begun),
            "begun": begun,
            "extra_begun": begun - len(self.begun),
            # When each request answered more than once was first answered (Unix
            # seconds, sorted; the first MAX_REPEATS_LISTED): a test can tell whether
            # its first answer came just before a crash (the residual window).
            "repeated_first_answered_at": sorted(
                self._first[key] for key, n in self.answered.items() if n > 1
            )[:MAX_REPEATS_LISTED],
        }

    def reset(self) -> None:
        """Forget every count."""
        self.begun.clear()
        self.answered.clear()
        self._first.clear()
