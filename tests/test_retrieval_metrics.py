"""Recall, NDCG and hit rate at k, and the baselines (helpers/retrieval_metrics.py): on hand-made rankings
whose figures are known, and the chunked and per-rank paths against the whole-at-once one. All fast, no
training."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from helpers.retrieval_metrics import (
    RetrievalEvaluation,
    UserSets,
    ranking_metrics,
    show_recommendations,
    top_k,
)


def _frame(pairs: list[tuple[int, int]]) -> pd.DataFrame:
    return pd.DataFrame(pairs, columns=["user", "movie"])


def test_metrics_of_a_ranking_worked_by_hand():
    # 6 items; the user saw item 0 in training, holds items 2 and 5; the scores rank 0 > 1 > 2 > 3 > 4 > 5
    scores = torch.tensor([[6.0, 5, 4, 3, 2, 1]])
    seen = torch.tensor([[True, False, False, False, False, False]])
    held = torch.tensor([[False, False, True, False, False, True]])
    assert top_k(scores, seen, 3).tolist() == [[1, 2, 3]]            # the seen item is never recommended
    recall, ndcg, hit = ranking_metrics(scores, seen, held, k=3)[0].tolist()
    assert recall == pytest.approx(0.5)                               # item 2 found, item 5 not
    ideal = 1 + 1 / math.log2(3)                                      # both held items at the top
    assert ndcg == pytest.approx((1 / math.log2(3)) / ideal)           # found at rank 2
    assert hit == 1.0
    miss = ranking_metrics(-scores, seen, torch.tensor([[False, True, False, False, False, False]]), k=3)[0]
    assert miss.tolist() == [0.0, 0.0, 0.0]                           # item 1 ranked last: not in the top 3


def test_dense_masks_from_sparse_sets():
    sets = UserSets(offsets=np.array([0, 2, 2, 3]), items=np.array([4, 1, 0]))
    mask = sets.dense(np.array([0, 1, 2]), 5)
    assert mask.int().tolist() == [[0, 1, 0, 0, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]]
    assert sets.dense(np.array([], dtype=int), 5).shape == (0, 5)


@pytest.fixture
def evaluation() -> RetrievalEvaluation:
    rng = np.random.default_rng(0)
    users, items = 40, 30
    train = _frame([(u, int(m)) for u in range(users) for m in rng.choice(items, 8, replace=False)])
    test = _frame([(u, int(m)) for u in range(0, users, 2) for m in rng.choice(items, 3, replace=False)])
    test = test.merge(train, how="left", indicator=True).query("_merge == 'left_only'").drop(columns="_merge")
    return RetrievalEvaluation.build(train, test, items, seed=0)


def test_build_keeps_users_with_held_out_items_and_their_sets(evaluation):
    assert (evaluation.users == np.arange(0, 40, 2)).all()            # only users with held-out items
    first = evaluation.seen.items[evaluation.seen.offsets[0]:evaluation.seen.offsets[1]]
    assert len(first) == 8                                            # user 0's training items
    assert evaluation.names("val_") == ["val_recall_at_10", "val_ndcg_at_10", "val_hit_at_10"]


def test_a_seeded_sample_of_users_and_refusals(evaluation):
    train = _frame([(u, m) for u in range(50) for m in range(5)])
    test = _frame([(u, 7) for u in range(50)])
    a = RetrievalEvaluation.build(train, test, 10, eval_users=7, seed=3)
    b = RetrievalEvaluation.build(train, test, 10, eval_users=7, seed=3)
    assert len(a.users) == 7 and (a.users == b.users).all() and (np.diff(a.users) > 0).all()
    assert not (a.users == RetrievalEvaluation.build(train, test, 10, eval_users=7, seed=4).users).all()
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ValueError, match="eval_users="):
            RetrievalEvaluation.build(train, test, 10, eval_users=bad)
    with pytest.raises(ValueError, match="no user has enough interactions"):
        RetrievalEvaluation.build(train, test.iloc[:0], 10)


def test_chunks_and_ranks_agree_with_the_whole(evaluation):
    """Scored a chunk at a time, or by two ranks each on its share and summed, the means are the same."""
    weights = torch.randn(40, 30, generator=torch.Generator().manual_seed(1))

    def scores(users: torch.Tensor) -> torch.Tensor:
        return weights[users]

    whole = evaluation.evaluate(scores, chunk=1024)
    assert np.allclose(evaluation.evaluate(scores, chunk=3), whole, atol=1e-12)
    sums = torch.zeros(4, dtype=torch.float64)
    for rank in range(2):
        share = evaluation.share(rank, 2)
        for rows, users in torch.utils.data.DataLoader(share, batch_size=4):
            sums += evaluation.metric_sums(rows, scores(users))
    assert sums[3] == len(evaluation.users)
    np.testing.assert_allclose((sums[:3] / sums[3]).numpy(), whole, atol=1e-7)
    shares = [set(evaluation.share(r, 3).tensors[0].tolist()) for r in range(3)]
    assert set().union(*shares) == set(range(len(evaluation.users))) and sum(map(len, shares)) == 20


def test_baselines_popular_beats_random_when_popularity_predicts(evaluation):
    counts = np.zeros(30, dtype=np.int64)
    held = evaluation.held.items
    np.add.at(counts, held, 10)                         # the held-out items are the popular ones
    table = evaluation.baselines(counts, seed=0)
    assert list(table.index) == ["most popular", "random"]
    assert table.loc["most popular", "recall_at_10"] > table.loc["random", "recall_at_10"]
    assert table.equals(evaluation.baselines(counts, seed=0))          # seeded
    assert not table.loc["random"].equals(evaluation.baselines(counts, seed=1).loc["random"])


def test_show_recommendations_marks_the_hits(evaluation, capsys):
    data = SimpleNamespace(train=pd.DataFrame({"user": [0, 0], "movie": [1, 2], "timestamp": [1, 2]}),
                           test=pd.DataFrame({"user": [0], "movie": [int(evaluation.held.items[0])]}),
                           user_ids=np.arange(100, 140))
    titles = np.array([f"m{i}" for i in range(30)])
    target = int(evaluation.held.items[0])

    def model(users: torch.Tensor) -> torch.Tensor:   # ranks the held-out item first
        scores = torch.zeros(len(users), 30)
        scores[:, target] = 1.0
        return scores

    show_recommendations(model, evaluation, data, titles, count=1)
    out = capsys.readouterr().out
    assert out.startswith("user 100: recently watched m1, m2")
    assert f"top 10: ✓ m{target};" in out and f"watched later: m{target}" in out
