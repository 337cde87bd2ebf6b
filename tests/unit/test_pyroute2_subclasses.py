"""pycni's subclasses of pyroute2 message classes keep their own attribute tables whatever
pyroute2 used first (pyroute2 marks a class's table compiled on first use, and a subclass
inherits the mark)."""

from __future__ import annotations

import subprocess
import sys

_MACVLAN_AFTER_MACVX = """
from pyroute2.netlink.rtnl.ifinfmsg import macvx_data
first = macvx_data(); first["attrs"] = [("IFLA_MACVLAN_MODE", 4)]; first.encode()
from pycni_plugins.kernel import links
msg = links._macvlan_data(); msg["attrs"] = [("IFLA_MACVLAN_BC_QUEUE_LEN", 7)]; msg.encode()
print(msg.data.hex())
"""


def test_macvlans_bc_queue_len_is_encoded_even_when_pyroute2s_macvx_data_was_used_first():
    out = subprocess.run([sys.executable, "-c", _MACVLAN_AFTER_MACVX], capture_output=True, text=True, check=True)
    # header (4) + IFLA_MACVLAN_BC_QUEUE_LEN (type 7): length 8, u32 7
    assert out.stdout.strip() == "0c0000000800070007000000"
