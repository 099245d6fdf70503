"""Owners across a run: identities that some round valued as one player, pooled into one row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedsv.valuation.accounting.round_matrices import FloatArray, RoundMatrices


@dataclass(frozen=True)
class Owners:
    """A partition of a run's identities (`ids`, in the accounting's order) into owners: two identities
    that any round valued as one player (redundant members: their updates far more alike than
    independent data give) belong to one owner for the whole run, and so does any identity linked to
    either of them.

    The completion and the shrunk value take an owner's rows pooled (pool: its identities' round
    values summed, selected where any was), so that an owner who joins twice is valued as one member
    among the owners, and its total is split equally among its identities (split): together they get
    what one of them would, not one share each."""

    ids: list[str]
    groups: list[list[int]]  # owner g holds identities groups[g] (indices into ids), by first identity

    @classmethod
    def linked(cls, ids: Sequence[str], merged: Sequence[Sequence[str]]) -> Owners:
        """The owners of `ids` where each of `merged` (identities some round valued as one player) is
        joined into one (union-find; an identity not in `ids` is ignored)."""
        index = {pid: i for i, pid in enumerate(ids)}
        parent = list(range(len(ids)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for group in merged:
            members = [index[pid] for pid in group if pid in index]
            for other in members[1:]:
                a, b = root(members[0]), root(other)
                parent[max(a, b)] = min(a, b)
        groups: dict[int, list[int]] = {}
        for i in range(len(ids)):
            groups.setdefault(root(i), []).append(i)
        return cls(list(ids), sorted(groups.values(), key=lambda g: g[0]))

    @property
    def pooled(self) -> bool:
        """Whether any owner holds more than one identity (otherwise pooling changes nothing)."""
        return any(len(g) > 1 for g in self.groups)

    @property
    def labels(self) -> list[str]:
        """Each owner's name: its first identity's id."""
        return [self.ids[g[0]] for g in self.groups]

    def shared(self) -> list[list[str]]:
        """The owners of more than one identity, as their identities' ids."""
        return [[self.ids[i] for i in g] for g in self.groups if len(g) > 1]

    def _sum(self, values: FloatArray, axis: int) -> FloatArray:
        moved = np.moveaxis(np.asarray(values, dtype=np.float64), axis, 0)
        out = np.stack([moved[g].sum(axis=0) for g in self.groups]) if self.groups else moved[:0]
        return np.asarray(np.moveaxis(out, 0, axis), dtype=np.float64)

    def _any(self, flags: np.ndarray) -> np.ndarray:
        return np.stack([flags[:, g].any(axis=1) for g in self.groups], axis=1)

    def pool(self, matrices: RoundMatrices) -> RoundMatrices:
        """The round matrices with an owner's identities as one column: values summed, selected (and
        aggregated) where any of them was, the estimator's errors added as if fully correlated (a merged
        round split one player's value equally; elsewhere an upper bound), m_t the owners selected."""
        if not self.pooled:
            return matrices
        mask = self._any(matrices.mask)
        errors = self._sum(np.sqrt(matrices.estimator_variance), axis=1)
        return RoundMatrices(
            ids=self.labels,
            fedsv=self.pool_values(matrices.fedsv),
            loo=self.pool_values(matrices.loo),
            mask=mask,
            estimator_variance=np.square(errors),
            selected=[int(n) for n in mask.sum(axis=1)],
            fedsv_folds=self.pool_values(matrices.fedsv_folds),
            loo_folds=self.pool_values(matrices.loo_folds),
            shares=matrices.shares,
            accepted=self._any(matrices.accepted),
            initial_spread=matrices.initial_spread,
            # an owner of several identities is selected more often than the balanced rule selects one
            # member, so its reruns are drawn afresh (balanced left False)
        )

    def pool_values(self, values: FloatArray) -> FloatArray:
        """Round values (T, N, ...) with an owner's identities summed into one column (T, K, ...)."""
        return self._sum(values, axis=1) if self.pooled else np.asarray(values, dtype=np.float64)

    def split(self, values: FloatArray) -> FloatArray:
        """Per-owner totals or errors (K, ...) to per-identity ones (N, ...): an owner's split equally."""
        values = np.asarray(values, dtype=np.float64)
        if not self.pooled:
            return values
        out = np.zeros((len(self.ids), *values.shape[1:]))
        for g, members in enumerate(self.groups):
            out[members] = values[g] / len(members)
        return out
