"""kernel/errors: how a plugin reports a kernel refusal it does not handle."""

from __future__ import annotations

import errno

import pytest

from pycni import netns
from pycni.errors import CNIError, ErrorCode
from pycni_plugins.kernel.errors import LinkError, failing, netns_gone


def test_failing_words_a_refusal_as_the_reference_does() -> None:
    with pytest.raises(CNIError) as err, failing('failed to set "eth0" UP'):
        raise LinkError(errno.EPERM, "Operation not permitted")
    assert err.value.code == ErrorCode.INTERNAL
    assert err.value.msg == 'failed to set "eth0" UP: Operation not permitted'
    assert isinstance(err.value.__cause__, LinkError)


def test_failing_leaves_everything_else_alone() -> None:
    with pytest.raises(ValueError), failing("what"):
        raise ValueError("not the kernel's")
    with pytest.raises(CNIError) as err, failing("what"):
        raise CNIError("already the plugin's", code=ErrorCode.INVALID_NETWORK_CONFIG)
    assert err.value.msg == "already the plugin's"


def test_netns_gone_is_a_missing_path_or_not_a_namespace() -> None:
    assert netns_gone(netns.NetnsError(errno.ENOENT, "No such file or directory"))
    assert netns_gone(netns.NetnsError(errno.EINVAL, "Invalid argument"))
    assert not netns_gone(netns.NetnsError(errno.EACCES, "Permission denied"))
    assert not netns_gone(LinkError(errno.ENOENT, "No such file or directory"))
