"""Retrieval metrics of a recommender judged on what each user did later: recall, NDCG and hit rate at k, and
the most-popular and random baselines scored by the same code.

For each evaluation user, every item is scored, the items the user already had in training are dropped, and
the top k are compared with the user's held-out items: **recall@k** is the share of the held-out items found
there, **NDCG@k** also rewards finding them near the top, **hit rate@k** is the share of users with at least
one found.

Built to scale (notebook 03 at the ml-25m shape: 162,541 users x 59,047 movies): the evaluation uses a
seeded sample of users, keeps each one's items as two sparse sets (offsets into one array of item indices,
which grow with the interactions, not with users x items) and scores users in chunks, turning only one chunk
at a time into dense masks. At that shape a dense users x items mask would be about 10 GB and the score
matrix about 40 GB; here the largest object is one chunk of scores (1,024 x 59,047 floats, 242 MB), in the
kernel and in every rank (`metric_sums` is what a rank's validation step calls on its own users).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

K = 10
NAMES = ("recall", "ndcg", "hit")   # the order of every metric vector here


@dataclass(frozen=True)
class UserSets:
    """Each evaluation user's items, sparse: user i's are `items[offsets[i]:offsets[i + 1]]`."""

    offsets: np.ndarray
    items: np.ndarray

    def dense(self, rows: np.ndarray, num_items: int) -> torch.Tensor:
        """The boolean users x items mask of a few users (a chunk), from their sparse sets."""
        counts = self.offsets[rows + 1] - self.offsets[rows]
        mask = torch.zeros(len(rows), num_items, dtype=torch.bool)
        cols = (np.concatenate([self.items[self.offsets[r]:self.offsets[r + 1]] for r in rows]) if len(rows)
                else np.array([], int))
        mask[torch.from_numpy(np.repeat(np.arange(len(rows)), counts)), torch.from_numpy(cols)] = True
        return mask


def top_k(scores: torch.Tensor, seen: torch.Tensor, k: int = K) -> torch.Tensor:
    """Each user's (row's) top k items, best first, among those not seen in training."""
    return scores.float().masked_fill(seen, float("-inf")).topk(k, dim=1).indices


def ranking_metrics(scores: torch.Tensor, seen: torch.Tensor, held: torch.Tensor, k: int = K) -> torch.Tensor:
    """Per-user recall@k, NDCG@k and hit@k (rows: users), ranking only the items not seen in training."""
    top = top_k(scores, seen, k)
    hits = held.gather(1, top).float()
    n_held = held.sum(1).float()
    discount = 1.0 / torch.log2(torch.arange(2, k + 2, dtype=torch.float32, device=scores.device))
    ideal = torch.cumsum(discount, 0)[n_held.clamp(max=k).long() - 1]
    return torch.stack([hits.sum(1) / n_held, (hits * discount).sum(1) / ideal, (hits.sum(1) > 0).float()], 1)


@dataclass(frozen=True)
class RetrievalEvaluation:
    """The evaluation users and what each one had in training (`seen`, never recommended) and later (`held`,
    what we hope to find). Picklable: it travels to the ranks, which score their own share of the users."""

    users: np.ndarray   # the evaluation users' indices, sorted
    seen: UserSets
    held: UserSets
    num_items: int
    k: int = K

    @classmethod
    def build(cls, train: pd.DataFrame, test: pd.DataFrame, num_items: int, *, eval_users: int | None = None,
              seed: int = 0, k: int = K) -> RetrievalEvaluation:
        """From interaction tables with integer `user` and item (`movie`) index columns: the users that have
        held-out interactions, or a seeded sample of `eval_users` of them (None: all)."""
        if eval_users is not None and (isinstance(eval_users, bool) or not isinstance(eval_users, int)
                                       or eval_users < 1):
            raise ValueError(f"eval_users={eval_users!r}: set a number of users >= 1, or None to evaluate "
                             "every user.")
        users = np.sort(test.user.unique())
        if not len(users):
            raise ValueError("no user has enough interactions to hold some out for evaluation: lower "
                             "holdout, or use a data set whose users rated more items.")
        if eval_users is not None and len(users) > eval_users:   # a seeded sample of them
            users = np.sort(np.random.default_rng(seed).choice(users, eval_users, replace=False))
        position = pd.Series(np.arange(len(users)), index=users)

        def sets(frame: pd.DataFrame) -> UserSets:
            rows = frame[frame.user.isin(users)]
            at = position[rows.user].to_numpy()
            order = np.argsort(at, kind="stable")
            offsets = np.searchsorted(at[order], np.arange(len(users) + 1))
            return UserSets(offsets, rows.movie.to_numpy()[order])

        return cls(users, sets(train), sets(test), num_items, k)

    def seen_mask(self, rows: np.ndarray) -> torch.Tensor:
        """What the users at positions `rows` had in training, as a dense mask (to leave out of a top k)."""
        return self.seen.dense(np.asarray(rows), self.num_items)

    def metrics(self, rows: np.ndarray, scores: torch.Tensor) -> torch.Tensor:
        """Per-user recall, NDCG and hit at k of the users at positions `rows`, given their scores."""
        seen, held = (s.dense(rows, self.num_items).to(scores.device) for s in (self.seen, self.held))
        return ranking_metrics(scores, seen, held, self.k)

    def metric_sums(self, rows: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """The sums of recall, NDCG and hit over these users, and their count (float64): what ranks add up
        over their batches and all-reduce, so that every rank ends with the mean over all users."""
        metrics = self.metrics(rows.numpy(force=True), scores)
        return torch.cat([metrics.sum(0).double(), metrics.new_tensor([len(rows)]).double()])

    def share(self, rank: int, world_size: int) -> torch.utils.data.TensorDataset:
        """Rank `rank`'s share of the evaluation users, as (position, user index) pairs for a validation
        loader: positions rank, rank + world_size, ..."""
        rows = torch.arange(rank, len(self.users), world_size)
        return torch.utils.data.TensorDataset(rows, torch.as_tensor(self.users)[rows])

    def evaluate(self, score_users: Callable[[torch.Tensor], torch.Tensor], chunk: int = 1024) -> np.ndarray:
        """Mean recall, NDCG and hit rate at k over the evaluation users, `chunk` users at a time;
        `score_users(users)` scores every item for a tensor of user indices (a model, say; run without
        gradients)."""
        sums = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for start in range(0, len(self.users), chunk):
                rows = np.arange(start, min(start + chunk, len(self.users)))
                sums += self.metrics(rows, score_users(torch.as_tensor(self.users[rows]))).double().sum(0)
        return (sums / len(self.users)).numpy()

    def table(self, rankers: dict[str, Callable[[torch.Tensor], torch.Tensor]]) -> pd.DataFrame:
        """`evaluate` for each of `rankers` (name -> scorer of user indices): one row each, in that order."""
        return pd.DataFrame({name: self.evaluate(score) for name, score in rankers.items()},
                            index=self.names()).T

    def names(self, prefix: str = "") -> list[str]:
        """The metrics' names, as logged and recorded: recall_at_10, ndcg_at_10, hit_at_10."""
        return [f"{prefix}{name}_at_{self.k}" for name in NAMES]

    def baselines(self, item_counts: np.ndarray, seed: int = 0) -> pd.DataFrame:
        """The metrics of two rankings that learn nothing per user: **most popular** (items by their number of
        training interactions) and **random** (seeded); one row each."""
        popular = torch.from_numpy(item_counts).float()
        generator = torch.Generator().manual_seed(seed)
        def random(users: torch.Tensor) -> torch.Tensor:
            return torch.rand(len(users), self.num_items, generator=generator)

        return self.table({"most popular": lambda users: popular.expand(len(users), -1), "random": random})



def show_recommendations(model: Callable[[torch.Tensor], torch.Tensor], evaluation: RetrievalEvaluation,
                         data: Any, titles: np.ndarray, count: int = 3, recent: int = 3) -> None:
    """A retrieval demo: for the first `count` evaluation users, the `recent` items each had last in training,
    the model's top k (items seen in training left out) with ✓ on the items the user had later (a hit), and
    those later items. `model` scores every item for a tensor of user indices.

    `data` has the interaction tables `train` and `test` (columns `user`, `movie`, `timestamp`) and
    `user_ids`, each user index's id (as `helpers.data.movielens.Interactions`); `titles`, each item index's
    title.
    """
    rows = np.arange(min(count, len(evaluation.users)))
    users = evaluation.users[rows]
    with torch.no_grad():
        top = top_k(model(torch.as_tensor(users)), evaluation.seen_mask(rows), evaluation.k)
    train, test = data.train, data.test
    for u, ranked in zip(users, top.tolist(), strict=True):
        later = set(test.movie[test.user == u])
        last = train[train.user == u].sort_values("timestamp").movie.tail(recent)
        print(f"user {data.user_ids[u]}: recently watched {', '.join(titles[last])}")
        print(f"  top {evaluation.k}: " + "; ".join(("✓ " if m in later else "") + titles[m] for m in ranked))
        print("  watched later: " + "; ".join(titles[m] for m in sorted(later)))
