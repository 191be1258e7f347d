"""Reference model of the response sequencer: one list, oldest request first.

Each entry is ``[slot, completed, response]``. A request appends an entry; a completion
fills one in; releasing pops completed entries off the front and stops at the first
that is not. That is the whole ordering rule Kafka clients rely on.
"""

from __future__ import annotations

from typing import Any


class ResponseOrderModel:
    def __init__(self) -> None:
        self.entries: list[list[Any]] = []
        self.next_slot = 0

    def register(self) -> int:
        slot = self.next_slot
        self.next_slot += 1
        self.entries.append([slot, False, None])
        return slot

    def can_complete(self, slot: int) -> bool:
        """Only a slot still waiting in the list, and not yet completed, may complete."""
        return any(entry[0] == slot and not entry[1] for entry in self.entries)

    def complete(self, slot: int, response: Any) -> None:
        assert self.can_complete(slot)
        for entry in self.entries:
            if entry[0] == slot:
                entry[1], entry[2] = True, response

    def pop_ready(self) -> list[tuple[int, Any]]:
        ready = []
        while self.entries and self.entries[0][1]:
            slot, _, response = self.entries.pop(0)
            ready.append((slot, response))
        return ready

    @property
    def in_flight(self) -> int:
        return len(self.entries)
