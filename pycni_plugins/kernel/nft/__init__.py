"""nftables for every pycni plugin: one transaction per operation, in pycni's own tables.

* **Own tables only.** Everything lives in ``table inet pycni`` (and ``table bridge pycni`` for
  the MAC spoof check); :mod:`.transport` names them and is the one caller of libnftables.
* **Per-container state is set/map elements, never rules.** The rules are a fixed skeleton that
  looks containers up in hash sets and maps (see :mod:`..layout`), so the first packet of a
  connection costs the same at 10 containers as at 10,000, and an ADD or DEL adds or deletes a
  handful of elements whatever the table holds. Interval sets are avoided on purpose: libnftables
  loads an interval set's elements into userspace to merge ranges, which makes every update
  O(n); the same goes for ``get element``, ``list chain`` and dry runs, which are therefore kept
  off the ADD/DEL path.
* **One transaction.** An operation's changes are one ``Nftables.cmd`` call, which libnftables
  sends as one netlink batch: it applies completely or not at all.
* **The skeleton** is created lazily and race-free, verified and repaired (:mod:`.skeleton`).
* **Who owns what**: each element's comment and a record per attachment under the state dir
  (:mod:`.ownership`); ADD, DEL and CHECK of an attachment's elements (:mod:`.attach`); GC and
  forced cleanup, by listing the tables (:mod:`.listing`).
"""

from .attach import apply, missing, release
from .listing import Found, attachments, collect, gc, map_elements, remove, remove_attachments, restore, restore_all
from .ownership import Comment, Element, comment, holder
from .skeleton import Section, chains, check, ensure, hinted, reconcile_hint, repair, skeleton_problems
from .transport import (
    TABLE,
    VERIFY_EVERY,
    ElementConflict,
    NftBusy,
    NftError,
    NftInterrupted,
    NftNotFound,
    commits_since,
    generation,
    list_table,
    run,
    run_json,
    status,
)

__all__ = [
    "TABLE",
    "VERIFY_EVERY",
    "NftError",
    "ElementConflict",
    "NftNotFound",
    "NftBusy",
    "NftInterrupted",
    "Comment",
    "comment",
    "Element",
    "Section",
    "run",
    "generation",
    "commits_since",
    "status",
    "ensure",
    "apply",
    "release",
    "missing",
    "holder",
    "map_elements",
    "Found",
    "attachments",
    "remove",
    "remove_attachments",
    "list_table",
    "run_json",
    "collect",
    "gc",
    "skeleton_problems",
    "repair",
    "check",
    "chains",
    "restore",
    "restore_all",
    "reconcile_hint",
    "hinted",
]
