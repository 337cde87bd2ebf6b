"""The iptables compatibility step: pycni's accepts where an iptables ``FORWARD`` drop lives.

In nftables an ``accept`` ends only its own base chain, so pycni's ``table inet pycni`` cannot
overrule Docker's ``FORWARD`` policy DROP (iptables-nft's ``table ip filter``) or legacy
iptables'. On such a host pycni does what the Go firewall plugin does: a jump at the top of
``filter FORWARD`` to its own chain, written with the host's own iptables tools in the flavour
the host uses (``iptables-nft``/``iptables-legacy``, ``ip6tables-*`` for IPv6), so
``iptables-save`` lists it normally::

    -A FORWARD -m comment --comment "pycni forward" -j PYCNI-FORWARD
    -A PYCNI-FORWARD -d 198.18.64.0/20 -o nomad -m comment --comment "pycni admin NOMAD-ADMIN" -j ACCEPT
    -A PYCNI-FORWARD -d 198.18.64.2/32 -m conntrack --ctstate RELATED,ESTABLISHED
        -m comment --comment "<key> firewall <net> <cid> eth0" -j ACCEPT
    -A PYCNI-FORWARD -s 198.18.64.2/32 -m comment --comment "<key> firewall <net> <cid> eth0" -j ACCEPT

Per address: replies (established, related) and everything from it, as the Go plugin's
``CNI-FORWARD``; each rule's comment is the attachment's (:class:`~.nft.Comment`: its key
first), so DEL and GC find them without a record. The admin rules mirror the accepts of
pycni's nftables admin chain for the attachment's bridge (Nomad's ``-o <bridge> -d <subnet> -j
ACCEPT``) and are shared: they go with the chain, which goes (jump, rules, chain, in one batch)
with the last attachment rule. A ``table ip filter`` that iptables-nft created for pycni alone
(the jump's comment says so) is deleted with it when nothing else is left in it.

Every change is one ``<tool>-restore -w --noflush`` batch built from one read of the table
(:func:`look`: iptables-nft's through libnftables in-process, legacy's with ``<tool>-save -t
filter``) under a lock in the state dir (``<state>/iptables/.lock``), so two plugins do not
interleave their read and write; the chain is made with ``-N``, so a writer that made it
meanwhile fails the batch (changing nothing) instead of having it flushed. An attachment's
iptables-nft rules that are not the last are deleted in-process by handle
(:func:`remove_nft_fast`); everything else goes through ``-save`` and ``-restore``. The tools run
in the calling thread's network namespace (a child forked by a thread shares its namespace) with
``PATH`` set to the system dirs. A host without iptables tables (:func:`present`) runs none.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from logging import DEBUG

import attrs

from .. import changes
from .rules import (
    ADMIN_COMMENT,
    CHAIN,
    IPNetwork,
    IptablesError,
    Rules,
    Sig,
    admin_rules,
    admin_tokens,
    attachment_rules,
    comment_of,
    line,
    parse_save,
    quote,
    sig_of_nft,
    sig_of_tokens,
)

__all__ = [
    "CHAIN",
    "JUMP_COMMENT",
    "Place",
    "IptablesError",
    "admin_rules",
    "Rules",
    "read",
    "run_tool",
    "apply",
    "append_existing",
    "remove_nft_fast",
    "Table",
    "look",
    "present",
    "survey",
    "remove",
    "missing",
    "loaded",
    "locked",
    "nft_admin_rules",
    "attachment_rules",
    "admin_tokens",
    "comment_of",
    "parse_save",
]

JUMP_COMMENT = "pycni forward"
#: The jump's comment when iptables-nft made ``table ip filter``/``ip6 filter`` for pycni alone.
JUMP_COMMENT_CREATED = "pycni forward (table created by pycni)"
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin"
_TIMEOUT = 30


@attrs.frozen(order=True)
class Place:
    """Where the compatibility rules go: IP version 4 or 6, flavour ``nft`` or ``legacy``."""

    version: int
    flavour: str

    def tool(self, suffix: str = "") -> str:
        return f"{'iptables' if self.version == 4 else 'ip6tables'}-{self.flavour}{suffix}"

    @property
    def where(self) -> str:
        """How the host-firewall judge (:mod:`.hostfw`) names this table in its findings."""
        if self.flavour == "legacy":
            return f"{self.tool()} table filter"
        return f"table {'ip' if self.version == 4 else 'ip6'} filter"

    def to_json(self) -> list[object]:
        return [self.version, self.flavour]

    @classmethod
    def from_json(cls, data: object) -> Place | None:
        if isinstance(data, list) and len(data) == 2 and data[0] in (4, 6) and data[1] in ("nft", "legacy"):
            return cls(int(data[0]), str(data[1]))
        return None


# --- the host's tools -------------------------------------------------------------------------


def run_tool(argv: list[str], stdin: str | None = None) -> str:
    """Run one of the host's iptables tools (looked up in the system's sbin and bin dirs only,
    never the caller's ``PATH``) in the calling thread's namespace; its stdout, or
    :class:`IptablesError`."""
    path = shutil.which(argv[0], path=_SBIN)
    if path is None:
        raise IptablesError(f"{argv[0]} not found", f"looked in {_SBIN}")
    try:
        done = subprocess.run(
            [path, *argv[1:]],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
            check=False,
            env={"PATH": _SBIN},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise IptablesError(f"{argv[0]} failed: {e}") from None
    if done.returncode != 0:
        raise IptablesError(f"{argv[0]} failed (exit status {done.returncode})", done.stderr.strip())
    return done.stdout


def read(place: Place) -> Rules:
    """The ``filter`` table of ``place`` in the calling thread's namespace."""
    return parse_save(run_tool([place.tool("-save"), "-t", "filter"]))


def _restore(place: Place, lines: Sequence[str]) -> None:
    if lines:
        run_tool([place.tool("-restore"), "-w", "--noflush"], "*filter\n" + "\n".join(lines) + "\nCOMMIT\n")
        if changes.log.isEnabledFor(DEBUG):
            changes.iptables(place.tool("-restore"), list(lines))
        if place.flavour == "legacy":
            from ..nft.transport import memo

            memo().host_legacy = None  # the judge's legacy read is stale now (no generation tells it)


@attrs.frozen
class Table:
    """What the compatibility step needs of a ``filter`` table: whether it exists, its chains,
    ``FORWARD``'s policy, whether ``FORWARD`` jumps to pycni's chain, and that chain's rules."""

    exists: bool
    chains: frozenset[str] = frozenset()
    policy: str = ""
    jumped: bool = False
    ours: tuple[Sig, ...] = ()

    def needs(self) -> bool:
        """Docker's chains, a drop policy, or pycni's chain already: the step is wanted."""
        return CHAIN in self.chains or "DOCKER-USER" in self.chains or self.policy == "drop"

    @property
    def iptables(self) -> bool:
        """Written by iptables (its ``FORWARD`` chain is there), not an admin's own nftables
        table that happens to be called ``filter``: only then may pycni write to it."""
        return self.exists and "FORWARD" in self.chains

    @property
    def writable(self) -> bool:
        """iptables' own, or not there at all (iptables-nft makes it)."""
        return self.iptables or not self.exists


def look(place: Place) -> Table:
    """``place``'s ``filter`` table in the calling thread's namespace: iptables-nft's through
    libnftables (in-process, exact), legacy's with ``<tool>-save`` (only where it is loaded)."""
    if place.flavour == "legacy":
        if not loaded(place):
            return Table(False)
        text = run_tool([place.tool("-save"), "-t", "filter"])
        rules = parse_save(text)
        policy = next((ln.split()[1].lower() for ln in text.splitlines() if ln.startswith(":FORWARD ")), "")
        return Table(True, rules.chains, policy, bool(rules.jumps), tuple(sig_of_tokens(r) for r in rules.ours()))
    from ..nft.transport import NftError, context, has_table

    family = "ip" if place.version == 4 else "ip6"
    with contextlib.suppress(NftError):  # else libnftables' listing answers that too
        if not has_table(family, "filter"):
            return Table(False)  # most hosts: one netlink lookup, no libnftables cache fetch
    rc, out, _ = context().json_cmd({"nftables": [{"list": {"table": {"family": family, "name": "filter"}}}]})
    if rc != 0:
        return Table(False)
    chains: set[str] = set()
    policy, jumped, ours = "", False, []
    for o in (out or {}).get("nftables", ()):
        if not isinstance(o, dict):
            continue
        if isinstance(o.get("chain"), dict):
            c = o["chain"]
            chains.add(str(c.get("name")))
            if c.get("name") == "FORWARD":
                policy = str(c.get("policy", ""))
        elif isinstance(o.get("rule"), dict):
            r = o["rule"]
            if r.get("chain") == "FORWARD":
                jumped = jumped or any(
                    isinstance(e, dict) and (e.get("jump") or e.get("goto") or {}).get("target") == CHAIN
                    for e in r.get("expr", ())
                )
            elif r.get("chain") == CHAIN:
                ours.append(sig_of_nft(r))
    return Table(True, frozenset(chains), policy, jumped, tuple(ours))


def apply(place: Place, rules: Sequence[tuple[str, ...]], table: Table | None = None) -> list[tuple[str, ...]]:
    """Make sure the jump, the chain and ``rules`` (token tuples) are in ``place``: one
    ``-restore --noflush`` batch with what is missing of them in ``table`` (:func:`look`, read
    now if not given). The chain is made with ``-N``, which fails the whole batch (changing
    nothing) if another writer made it meanwhile — a declared ``:CHAIN`` line would flush it
    — and then the table is read again and the batch rebuilt, once. Returns the rules added."""
    for attempt in (1, 2):
        table = table if table is not None else look(place)
        have = set(table.ours)
        added = [r for r in dict.fromkeys(rules) if sig_of_tokens(r) not in have]
        lines: list[str] = []
        if CHAIN not in table.chains:
            lines.append(f"-N {CHAIN}")
        if not table.jumped:
            note = JUMP_COMMENT if table.exists else JUMP_COMMENT_CREATED
            lines.append(f"-I FORWARD 1 -m comment --comment {quote(note)} -j {CHAIN}")
        lines += [f"-A {CHAIN} {line(r)}" for r in added]
        try:
            _restore(place, lines)
        except IptablesError:
            if attempt == 2:
                raise
            table = None
            continue
        return added
    return []


def append_existing(place: Place, rules: Sequence[tuple[str, ...]]) -> bool:
    """Append an attachment's ``rules`` (none of which is there yet) to pycni's chain in one batch
    that reads nothing first: the jump is deleted and inserted again at the top and each admin
    rule deleted and appended again, so the batch fails, changing nothing, unless the chain,
    the jump and the admin rules are all there. False then (:func:`apply` does it with a read).
    For legacy iptables, whose ``-D`` is cheap; iptables-nft's is not."""
    jump = f"-m comment --comment {quote(JUMP_COMMENT)} -j {CHAIN}"
    lines = [f"-D FORWARD {jump}", f"-I FORWARD 1 {jump}"]
    for r in dict.fromkeys(rules):
        if comment_of(r).startswith(ADMIN_COMMENT):
            lines.append(f"-D {CHAIN} {line(r)}")
        lines.append(f"-A {CHAIN} {line(r)}")
    try:
        _restore(place, lines)
    except IptablesError:
        return False
    return True


def survey(versions: Iterable[int] = (4, 6)) -> tuple[list[Place], dict[Place, Table]]:
    """The iptables ``filter`` tables of the calling thread's namespace, for IP ``versions``:
    the loaded legacy ones (not read: that takes an exec) and iptables-nft's, read in-process
    (:func:`look`). Cheap on a host without them (a small ``/proc`` read and a failing listing
    per version), which then runs no iptables tool."""
    wanted = sorted(set(versions))
    legacy = [Place(v, "legacy") for v in wanted if loaded(Place(v, "legacy"))]
    tables = {}
    for v in wanted:
        place = Place(v, "nft")
        table = look(place)
        if table.exists:
            tables[place] = table
    return legacy, tables


def present(versions: Iterable[int] = (4, 6)) -> list[Place]:
    """:func:`survey`'s places."""
    legacy, tables = survey(versions)
    return sorted([*legacy, *tables])


def remove_nft_fast(place: Place, hosts: Sequence[IPNetwork]) -> bool:
    """Delete an attachment's rules (those matching its ``hosts`` as source or destination) from
    iptables-nft's chain by handle, in-process, in one transaction — unless they are the last
    attachment rules (then False: :func:`remove` takes the chain and jump too). False too
    when the chain cannot be listed."""
    from ..nft.transport import context

    family = "ip" if place.version == 4 else "ip6"
    ctx = context()
    rc, out, _ = ctx.json_cmd({"nftables": [{"list": {"chain": {"family": family, "table": "filter", "name": CHAIN}}}]})
    if rc != 0:
        return False
    mine: list[int] = []
    others = 0
    for o in (out or {}).get("nftables", ()):
        rule = o.get("rule") if isinstance(o, dict) else None
        if not isinstance(rule, dict):
            continue
        exprs = [e for e in rule.get("expr", ()) if isinstance(e, dict)]
        admin = any(e.get("match", {}).get("left", {}).get("meta", {}).get("key") == "oifname" for e in exprs)
        addrs = {
            str(e["match"].get("right"))
            for e in exprs
            if isinstance(e.get("match", {}).get("left"), dict)
            and e["match"]["left"].get("payload", {}).get("field") in ("saddr", "daddr")
        }
        if admin:
            continue
        if addrs and addrs <= {str(h.network_address) for h in hosts}:
            mine.append(int(rule["handle"]))
        else:
            others += 1
    if not others:
        return False
    if mine:
        rc, _, err = ctx.json_cmd(
            {
                "nftables": [
                    {"delete": {"rule": {"family": family, "table": "filter", "chain": CHAIN, "handle": h}}}
                    for h in mine
                ]
            }
        )
        if rc != 0:
            return False
    return True


def remove(place: Place, doomed: Callable[[str], bool], keep_last: bool = False) -> list[tuple[str, ...]]:
    """Delete the rules of pycni's chain whose comment ``doomed`` says; when no attachment rule
    is left (unless ``keep_last``), the chain, its jumps and its admin rules too (and a table
    iptables-nft made for pycni alone). One batch; returns the rules deleted.

    The chain goes rule by rule and then ``-X``, never ``-F``: a rule another writer (a runtime
    with another state dir, so another lock) appended meanwhile makes ``-X`` fail the whole
    batch, changing nothing, and the table is read again, once."""
    if not loaded(place):
        return []
    for attempt in (1, 2):
        current = read(place)
        if CHAIN not in current.chains:
            return []
        ours = current.ours()
        gone = [r for r in ours if doomed(comment_of(r))]
        left = [r for r in ours if r not in gone and not comment_of(r).startswith(ADMIN_COMMENT)]
        drop_all = not left and not keep_last
        if drop_all:
            lines = [f"-D FORWARD {line(j)}" for j in current.jumps]
            lines += [f"-D {CHAIN} {line(r)}" for r in ours] + [f"-X {CHAIN}"]
        else:
            lines = [f"-D {CHAIN} {line(r)}" for r in gone]
        try:
            _restore(place, lines)
        except IptablesError:
            if attempt == 2:
                raise
            continue
        if drop_all and place.flavour == "nft" and any(comment_of(j) == JUMP_COMMENT_CREATED for j in current.jumps):
            _drop_empty_table(place)
        return gone
    return []


def _drop_empty_table(place: Place) -> None:
    """Delete iptables-nft's ``table ip[6] filter`` that it made for pycni, if nothing is in it
    (no rule, no user chain, no drop policy): the table is then as if never made."""
    from ..nft.transport import context

    family = "ip" if place.version == 4 else "ip6"
    ctx = context()
    rc, out, _ = ctx.json_cmd({"nftables": [{"list": {"table": {"family": family, "name": "filter"}}}]})
    if rc != 0:
        return
    objs = [o for o in (out or {}).get("nftables", ()) if "metainfo" not in o and "table" not in o]
    for o in objs:
        chain = o.get("chain")
        if not isinstance(chain, dict) or not chain.get("hook") or chain.get("policy", "accept") != "accept":
            return
    ctx.json_cmd({"nftables": [{"delete": {"table": {"family": family, "name": "filter"}}}]})


def missing(place: Place, rules: Sequence[tuple[str, ...]]) -> list[str]:
    """What of the jump, the chain and ``rules`` is not in ``place`` (as ``iptables`` texts),
    read as :func:`look` reads (iptables-nft's in-process)."""
    tool = place.tool()
    table = look(place)
    if CHAIN not in table.chains:
        return [f"{tool} chain {CHAIN}"]
    out = [] if table.jumped else [f"{tool} -I FORWARD 1 -j {CHAIN}"]
    have = set(table.ours)
    out += [f"{tool} -A {CHAIN} {line(r)}" for r in rules if sig_of_tokens(r) not in have]
    return out


def loaded(place: Place) -> bool:
    """Whether ``place``'s filter table can hold pycni's rules without reading it making it:
    legacy iptables' only where its ``filter`` table is loaded in the namespace (listing it with
    the legacy tools would load it); iptables-nft's always (listing creates nothing)."""
    if place.flavour != "legacy":
        return True
    name = "ip_tables_names" if place.version == 4 else "ip6_tables_names"
    try:
        with open(f"/proc/thread-self/net/{name}") as f:
            return "filter" in f.read().split()
    except OSError:
        return False


def nft_admin_rules(chain: str, interface: str) -> list[tuple[str, IPNetwork]]:
    """:func:`admin_rules` of pycni's nftables admin chain ``chain`` (none if it is missing)."""
    from ..nft.transport import TABLE, context

    rc, out, _ = context().json_cmd(
        {"nftables": [{"list": {"chain": {"family": "inet", "table": TABLE, "name": chain}}}]}
    )
    if rc != 0:
        return []
    return admin_rules([o for o in (out or {}).get("nftables", ()) if isinstance(o, dict)], interface)


@contextlib.contextmanager
def locked(state_dir: str) -> Iterator[None]:
    """Serialise read-then-write sequences of pycni's plugins (``<state>/iptables/.lock``)."""
    from ..state import Records

    with Records("iptables", state_dir).locked():
        yield
