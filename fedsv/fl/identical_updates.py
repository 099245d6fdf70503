"""The guard's screen of identical updates: members that send the very same vector.

No member's own training sends another member's update: each trains its own data from its own seed, so
even a second identity holding a copy of an owner's file moves the model by a different vector (a copy
trained with its own shuffling lies at 0.01 to 0.06 of the round's median pair distance from its
original). A group that sends one crafted vector from several identities ("a little is enough" and
inner-product manipulation as ByzFL defines them) multiplies that vector's weight in FedAvg by the
number of its members selected; every update of such a group is turned away (`identical_update`).
Updates of norm 0 are left to the null-update screen. Colluders that add noise of their own to the
vector send different updates and are not seen here.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedsv.fl.updates import ClientUpdate, flat_delta

SAME = 1e-6
"""Two updates are the same when their distance is at most this share of the larger norm (what a wire's
float32 round trip leaves of one vector; independent training lies orders of magnitude further)."""


def identical_updates(updates: Sequence[ClientUpdate]) -> dict[str, str]:
    """Participants whose update equals another participant's (within SAME), each with the first such
    partner (by participant order); updates of norm 0 are not compared."""
    flats = {u.participant: flat_delta(u.delta) for u in updates}
    norms = {p: float(f.norm()) for p, f in flats.items()}
    found: dict[str, str] = {}
    ids = [p for p in flats if norms[p] > 0]
    for i, p in enumerate(ids):
        for q in ids[i + 1 :]:
            scale = max(norms[p], norms[q])
            if abs(norms[p] - norms[q]) > SAME * scale:  # their distance is at least this: not the same
                continue
            if float((flats[p] - flats[q]).norm()) <= SAME * scale:
                found.setdefault(p, q)
                found.setdefault(q, p)
    return found
