"""LLM slots: a bound on requests in flight whose freed slot goes straight to the longest waiter, from any thread."""

from __future__ import annotations

import asyncio
import threading

from nanobotd.llm.slots import LLMSlots


def test_a_slot_given_back_on_another_thread_is_granted_to_the_first_waiter_there_and_then():
    granted_on: list[tuple[str, str]] = []

    async def scenario():
        slots = LLMSlots(1)
        holder = slots.take()
        await holder.granted
        waiters = [slots.take(lambda name=name: granted_on.append((name, threading.current_thread().name)))
                   for name in ("first", "second")]
        assert slots.in_use == 1 and not any(waiter.granted.done() for waiter in waiters)
        releaser = threading.Thread(target=holder.release, name="pipe-reader")
        releaser.start()
        releaser.join()
        # granted on the releasing thread, before this loop has run at all
        assert granted_on == [("first", "pipe-reader")]
        await waiters[0].granted
        assert not waiters[1].granted.done()
        waiters[0].release()
        await waiters[1].granted
        waiters[1].release()
        waiters[1].release()  # a second release does nothing
        return slots

    slots = asyncio.run(scenario())
    assert granted_on == [("first", "pipe-reader"), ("second", "MainThread")]
    assert slots.in_use == 0


def test_a_waiter_that_gives_up_leaves_the_queue_and_the_bound_holds_under_many_callers():
    most = {"now": 0, "max": 0}

    async def scenario():
        slots = LLMSlots(2)
        first, second = slots.take(), slots.take()
        quitter = slots.take()
        after = slots.take()
        quitter.release()  # stops waiting: the next slot goes to the one behind it
        first.release()
        await after.granted
        assert not quitter.granted.done() and slots.in_use == 2
        second.release()
        after.release()

        async def request():
            ticket = slots.take()
            try:
                await ticket.granted
                most["now"] += 1
                most["max"] = max(most["max"], most["now"])
                await asyncio.sleep(0.01)
                most["now"] -= 1
            finally:
                # half the slots come back from another thread, as the worker's pipe reader gives them back
                if id(ticket) % 2:
                    await asyncio.to_thread(ticket.release)
                else:
                    ticket.release()

        await asyncio.gather(*(request() for _ in range(30)))
        return slots

    slots = asyncio.run(scenario())
    assert most["max"] == 2
    assert slots.in_use == 0



def test_a_slot_the_worker_handed_on_passes_to_the_taker_without_a_grant_and_is_given_back_once():
    grants: list[str] = []

    async def scenario():
        slots = LLMSlots(2)
        a, b, c, d = (slots.take(lambda name=name: grants.append(name)) for name in "abcd")
        await a.granted
        await b.granted
        a.hand_over(c)  # the worker let c send in a's place: no "go" for c, and a's slot is c's now
        await c.granted
        assert grants == ["a", "b"] and slots.in_use == 2 and not d.holding
        a.release()  # a's answer, after the hand-over, gives nothing back
        assert not d.holding and slots.in_use == 2
        b.hand_over(c)  # c holds a slot already: b's goes round the queue, to d, with its "go"
        assert d.holding and grants == ["a", "b", "d"] and slots.in_use == 2
        c.release()
        f = slots.take(lambda: grants.append("f"))
        e = slots.take(lambda: grants.append("e"))
        assert f.holding and not e.holding
        c.hand_over(e)  # c's slot went back already: e's request is over the bound, and counted
        assert e.holding and slots.in_use == 3 and "e" not in grants
        for ticket in (d, e, f):
            ticket.release()
        return slots

    slots = asyncio.run(scenario())
    assert slots.in_use == 0
