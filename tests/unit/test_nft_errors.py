"""libnftables' error text becomes one typed NftError, in the one wrapper that talks to it."""

from __future__ import annotations

import pytest

from pycni.errors import CNIError, ErrorCode
from pycni_plugins.kernel import nft
from pycni_plugins.kernel.nft import transport


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("Error: Could not process rule: File exists\nadd element inet pycni x { 1 }\n", nft.ElementConflict),
        ("Error: Could not process rule: No such file or directory\nlist table ip nat\n", nft.NftNotFound),
        ("Error: Could not process rule: Device or resource busy\ndelete counter inet pycni c\n", nft.NftBusy),
        ("Error: Could not process rule: Interrupted system call\n", nft.NftInterrupted),
        ("Error: syntax error, unexpected junk\n", nft.NftError),
        ("", nft.NftError),
    ],
)
def test_libnftables_errors_are_typed_by_the_kernels_answer(text: str, kind: type[nft.NftError]) -> None:
    error = transport.error(text)
    assert type(error) is kind
    assert isinstance(error, CNIError) and error.code == ErrorCode.INTERNAL
    assert error.msg == (text.strip().splitlines()[0] if text.strip() else "unknown nftables error")
    assert error.details == text.strip()
