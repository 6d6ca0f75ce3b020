"""Clients belong to the session (issue 24 item 4): a session makes its AWS and Kubernetes clients when a
layer first needs them and closes them, threads included, when it ends."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pytest

from backend.clients import Clients, ClientsClosed
from tests.aws.conftest import World
from tests.aws.provision_world import session_for
from tests.eventually import eventually

AWS = ["--target", "aws", "--region", "us-east-1"]


def threads_left(before: set[int], deadline_s: float = 20.0) -> list[str]:
    """The threads started since ``before`` that are still alive once ``deadline_s`` passed (polled:
    a closed pool's idle workers end as soon as they read their stop, a busy one when its call returns).
    The running event loop's own executor (``asyncio_N``, ``asyncio.to_thread``) ends with the loop: not a client's."""
    left: list[str] = []

    def none_left() -> bool:  # polled: there is no event for "a thread ended"
        left[:] = [t.name for t in threading.enumerate()
                   if t.ident not in before and t.is_alive() and not t.name.startswith("asyncio_")]
        return not left

    with contextlib.suppress(AssertionError):  # the caller's assert names the threads left
        eventually("the client threads to end", none_left, deadline_s)
    return left


def test_a_plan_through_the_cli_leaves_no_client_thread_behind(
        world: World, kube_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tui import cli

    before = {t.ident for t in threading.enumerate() if t.ident is not None}
    assert cli.main(["plan", *AWS]) == 0, capsys.readouterr().err
    assert "+ aws.eks-cluster" in capsys.readouterr().out
    assert threads_left(before) == []


async def test_a_session_makes_each_client_once_and_closes_them_when_it_ends(world: World, kube_file: Path) -> None:
    from targets.aws.infra.common import aws_api

    before = {t.ident for t in threading.enumerate() if t.ident is not None}
    async with session_for() as session:
        api = aws_api(session.ctx)
        assert aws_api(session.ctx) is api  # one per region and profile, for the whole session
        await session.plan()
        assert len(session.clients) >= 1
        other = session_for()
        assert aws_api(other.ctx) is not api  # never shared with another session
        await other.aclose()
    assert session.clients.closed and len(session.clients) == 0
    with pytest.raises(ClientsClosed):
        aws_api(session.ctx)
    assert await asyncio.to_thread(threads_left, before) == []


def test_clients_close_each_client_once_even_under_two_keys() -> None:
    closed: list[str] = []

    class Fake:
        def __init__(self, name: str) -> None:
            self.name = name

        def close(self) -> None:
            closed.append(self.name)

    clients = Clients()
    a = clients.get("a", lambda: Fake("a"))
    assert clients.get("a", lambda: Fake("again")) is a
    clients.get("b", lambda: a)  # one client reached by two keys (an EKS cluster's API and its alias)
    clients.alias("eks", "a")
    assert clients.aliased("eks") is a
    clients.forget("eks")
    assert clients.aliased("eks") is None
    clients.close()
    clients.close()
    assert closed == ["a"]
