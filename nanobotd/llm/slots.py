"""LLM slots: at most `llm.concurrency` requests on their way to the model, handed on without the event loop.

A request that gets its answer frees its slot on the thread that reads the answer from the worker's pipe,
and that thread gives it at once to the longest-waiting request: its grant (the worker's "go") is sent from
there too. So a daemon loop busy with other work (a prompt being built, a status answer) never holds a slot
idle; the waiting caller's loop learns of the grant when it gets round to it. The worker itself may pass a
slot one of its calls frees to its own next call waiting on the same slots, and say so (`hand_over`), which
spares the round trip through the daemon. Slots are taken and given back from any thread and any event loop
(the daemon has one; tests run many).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable


class SlotTicket:
    """One request's claim on a slot: waiting, then holding, then given back (exactly once)."""

    def __init__(self, slots: LLMSlots, loop: asyncio.AbstractEventLoop, on_grant: Callable[[], None] | None):
        self._slots = slots
        self._loop = loop
        self._on_grant = on_grant
        self.granted: asyncio.Future = loop.create_future()
        self.holding = False
        self.done = False

    def release(self) -> None:
        """Give the slot back (or stop waiting for one); later calls do nothing. Safe from any thread."""
        self._slots._give_back(self)

    def hand_over(self, taker: SlotTicket) -> None:
        """The worker let *taker* send in this request's place (`LLMSlots.hand_over`)."""
        self._slots.hand_over(self, taker)

    def claim(self) -> None:
        """The worker let this call send in the place of one whose slot was given back already: count it as
        holding one (over the bound until a slot comes back)."""
        self._slots.claim(self)

    def _grant(self, *, announce: bool = True) -> None:
        """Called under the slots' lock, on the thread that freed the slot; *announce*: run on_grant."""
        self.holding = True
        if announce and self._on_grant is not None:
            self._on_grant()

        def settle() -> None:
            if not self.granted.done():
                self.granted.set_result(None)

        try:
            self._loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the waiter's loop has closed: nobody will use the slot
            threading.Thread(target=self.release, daemon=True).start()


class LLMSlots:
    """A fair (first come, first served) bound on requests in flight, shared by every client that holds it."""

    def __init__(self, count: int):
        self.count = max(1, int(count))
        self._free = self.count
        self._waiting: deque[SlotTicket] = deque()
        self._lock = threading.Lock()

    @property
    def in_use(self) -> int:
        """Slots held now."""
        with self._lock:
            return self.count - self._free

    def take(self, on_grant: Callable[[], None] | None = None) -> SlotTicket:
        """A ticket for the running loop: granted now if a slot is free, else when one is given back.
        *on_grant* runs as the slot is granted, on whichever thread grants it (it must not block)."""
        ticket = SlotTicket(self, asyncio.get_running_loop(), on_grant)
        with self._lock:
            if self._free > 0 and not self._waiting:
                self._free -= 1
                ticket._grant()
            else:
                self._waiting.append(ticket)
        return ticket

    def hand_over(self, freed: SlotTicket, taker: SlotTicket) -> None:
        """*freed*'s request is answered and the worker has already let *taker*, one of its calls waiting on
        these slots, send in its place (`llm.worker`): the slot passes to *taker* without going round the
        queue. Should *taker* hold a slot already, or have given up, *freed*'s is given back as usual; should
        *freed* have given its slot up already, *taker*'s request is over the bound, and counted."""
        with self._lock:
            if taker.done or taker.holding or freed.done:
                self._give_back_locked(freed)  # nothing to give back when freed is done
                self._claim_locked(taker)  # nothing to claim when taker holds a slot or gave up
                return
            self._waiting.remove(taker)
            freed.done = True
            taker._grant(announce=False)

    def claim(self, taker: SlotTicket) -> None:
        """*taker* is sending without a slot freed for it (`SlotTicket.claim`)."""
        with self._lock:
            self._claim_locked(taker)

    def _claim_locked(self, taker: SlotTicket) -> None:
        if taker.done or taker.holding:
            return
        self._waiting.remove(taker)
        self._free -= 1
        taker._grant(announce=False)

    def _give_back(self, ticket: SlotTicket) -> None:
        with self._lock:
            self._give_back_locked(ticket)

    def _give_back_locked(self, ticket: SlotTicket) -> None:
        if ticket.done:
            return
        ticket.done = True
        if not ticket.holding:
            self._waiting.remove(ticket)
            return
        if self._waiting:
            self._waiting.popleft()._grant()
        else:
            self._free += 1
