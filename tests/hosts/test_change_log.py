"""The debug log on a Docker host: the iptables compatibility step's -restore batch is a kernel
change like the others, named with its attachment."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from pycni.sdk import logs

from .conftest import World
from .profiles import DOCKER_LEGACY

pytestmark = pytest.mark.privileged


@pytest.fixture
def logged() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logs.configure(logging.DEBUG, stream=stream, env={})
    yield stream
    logging.getLogger().removeHandler(handler)
    for name in logs.LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)


@pytest.mark.parametrize("profile", [DOCKER_LEGACY], ids=lambda p: p.name, indirect=True)
def test_debug_log_names_the_iptables_restore_batch_and_its_attachment(world: World, logged: io.StringIO) -> None:
    rt, ip = world.container("c1")
    try:
        batches = [line for line in logged.getvalue().splitlines() if " iptables-legacy-restore [netns " in line]
        assert any(f"-A PYCNI-FORWARD -s {ip}/32" in line for line in batches), logged.getvalue()
        assert all(" container=c1 ifname=eth0 plugin=firewall command=ADD" in line for line in batches), batches
    finally:
        world.runtime.delete_network_list(world.network, rt)
