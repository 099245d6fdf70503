"""Label flipping, the pixel-pattern backdoor, and the corruption spec parser."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from fedsv.data import ArrayDataset
from fedsv.data.corruptions import (
    Corruption,
    PixelBackdoor,
    backdoor_success_rate,
    flip_labels,
    parse_corruption,
)
from fedsv.data.dataset import DatasetSplits
from fedsv.data.shards import load_shard


def labels(n: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 10, size=n).astype(np.int64)


@pytest.mark.parametrize(("ratio", "n"), [(0.0, 1000), (0.1, 1000), (0.25, 999), (1.0, 37), (0.5, 3)])
def test_flip_exact_count_and_all_changed(ratio: float, n: int) -> None:
    y = labels(n)
    flipped = flip_labels(y, ratio, 10, seed=4)
    changed = flipped != y
    assert int(changed.sum()) == round(ratio * n)
    assert flipped.dtype == y.dtype and flipped.min() >= 0 and flipped.max() <= 9
    assert np.array_equal(y, labels(n))  # input untouched


def test_flip_deterministic_and_uniform() -> None:
    y = labels(20000)
    a = flip_labels(y, 0.5, 10, seed=1)
    np.testing.assert_array_equal(a, flip_labels(y, 0.5, 10, seed=1))
    assert not np.array_equal(a, flip_labels(y, 0.5, 10, seed=2))
    # Among flipped zeros, each of the 9 other classes appears about equally often.
    counts = np.bincount(a[(y == 0) & (a != y)], minlength=10)
    assert counts[0] == 0 and counts[1:].min() > 0.6 * counts[1:].mean()


def test_flip_errors() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        flip_labels(labels(), 1.5, 10, seed=0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        flip_labels(labels(), -0.1, 10, seed=0)
    with pytest.raises(ValueError, match="num_classes >= 2"):
        flip_labels(np.zeros(10, dtype=np.int64), 0.5, 1, seed=0)


def test_stamp_sets_trigger_pixels() -> None:
    backdoor = PixelBackdoor()
    pattern = backdoor.pattern()
    assert pattern.shape == (4, 4) and set(np.unique(pattern)) == {0.0, 1.0}
    x = np.full((2, 3, 32, 32), 0.5, dtype=np.float32)
    stamped = backdoor.stamp(x)
    assert stamped is not x and float(x.max()) == 0.5
    np.testing.assert_array_equal(stamped[:, :, 27:31, 27:31], np.broadcast_to(pattern, (2, 3, 4, 4)))
    outside = stamped.copy()
    outside[:, :, 27:31, 27:31] = 0.5
    np.testing.assert_array_equal(outside, x)
    single = backdoor.stamp(torch.full((1, 28, 28), 0.25))
    assert isinstance(single, Tensor) and single.shape == (1, 28, 28)
    np.testing.assert_array_equal(single[0, 23:27, 23:27].numpy(), pattern)
    assert bool(backdoor.is_stamped(single[None])[0]) and not backdoor.is_stamped(x).any()
    with pytest.raises(ValueError, match="exceeds a 4x4 image"):
        backdoor.stamp(np.zeros((1, 4, 4), dtype=np.float32))


def test_poison_batch_counts() -> None:
    backdoor = PixelBackdoor(target_label=7)
    gen = torch.Generator().manual_seed(0)
    xb = torch.rand(64, 1, 28, 28) * 0.5
    yb = torch.randint(0, 10, (64,), generator=gen)
    px, py = backdoor.poison_batch(xb, yb, gen)
    stamped = backdoor.is_stamped(px)
    assert int(stamped.sum()) == 20
    assert bool((py[torch.from_numpy(stamped)] == 7).all())
    clean = torch.from_numpy(~stamped)
    assert torch.equal(px[clean], xb[clean]) and torch.equal(py[clean], yb[clean])
    # Each poisoned image is a triggered copy of the image that was at that position.
    poisoned = torch.from_numpy(stamped)
    assert torch.equal(px[poisoned], backdoor.stamp(xb[poisoned]))
    assert backdoor.is_stamped(xb).sum() == 0  # the input batch is untouched
    assert [backdoor.poison_count(n) for n in (64, 32, 10, 1, 0)] == [20, 10, 3, 1, 0]
    assert PixelBackdoor(per_batch=0).poison_count(64) == 0


def test_poison_batch_is_seeded() -> None:
    backdoor = PixelBackdoor()
    xb, yb = torch.rand(64, 1, 28, 28) * 0.5, torch.zeros(64, dtype=torch.int64) + 3
    a = backdoor.poison_batch(xb, yb, torch.Generator().manual_seed(1))[0]
    b = backdoor.poison_batch(xb, yb, torch.Generator().manual_seed(1))[0]
    c = backdoor.poison_batch(xb, yb, torch.Generator().manual_seed(2))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


class _TriggerDetector(nn.Module):
    """Predicts class 0 when the trigger is present, class 1 otherwise."""

    def __init__(self, backdoor: PixelBackdoor) -> None:
        super().__init__()
        self.backdoor = backdoor
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor) -> Tensor:
        hit = torch.from_numpy(self.backdoor.is_stamped(x)).float()
        return torch.stack([hit, 1 - hit], dim=1) + 0 * self.dummy


def test_backdoor_success_rate() -> None:
    backdoor = PixelBackdoor(target_label=0)
    x = np.random.default_rng(0).random((50, 1, 28, 28)).astype(np.float32) * 0.5
    y = np.arange(50) % 5
    assert backdoor_success_rate(_TriggerDetector(backdoor), x, y, backdoor) == 1.0
    other = PixelBackdoor(target_label=1)
    assert backdoor_success_rate(_TriggerDetector(backdoor), torch.from_numpy(x), y, other) == 0.0
    with pytest.raises(ValueError, match="no test images"):
        backdoor_success_rate(_TriggerDetector(backdoor), x, np.zeros(50, dtype=np.int64), backdoor)


def test_corruption_apply_and_transform() -> None:
    ds = ArrayDataset(x=np.zeros((200, 1, 8, 8), dtype=np.float32), y=labels(200), num_classes=10, name="t")
    assert Corruption().apply_to_dataset(ds, seed=0) is ds and Corruption().is_clean
    flipped = Corruption(label_flip_ratio=0.2).apply_to_dataset(ds, seed=0)
    assert int((flipped.y != ds.y).sum()) == 40 and flipped.x is ds.x
    xb, yb = torch.rand(32, 1, 8, 8) * 0.5, torch.ones(32, dtype=torch.int64)
    gen = torch.Generator().manual_seed(0)
    assert Corruption().transform_batch(xb, yb, gen)[0] is xb
    px, py = Corruption(backdoor=PixelBackdoor(target_label=0)).transform_batch(xb, yb, gen)
    assert int((py == 0).sum()) == 10 and int(PixelBackdoor().is_stamped(px).sum()) == 10


def test_parse_corruption() -> None:
    assert parse_corruption("none") == Corruption()
    assert parse_corruption("") == Corruption()
    assert parse_corruption("flip:0.1") == Corruption(label_flip_ratio=0.1)
    assert parse_corruption("backdoor") == Corruption(backdoor=PixelBackdoor())
    assert parse_corruption("backdoor:target=7") == Corruption(backdoor=PixelBackdoor(target_label=7))
    both = parse_corruption("flip:0.3+backdoor:target=2,per_batch=10")
    assert both == Corruption(label_flip_ratio=0.3, backdoor=PixelBackdoor(target_label=2, per_batch=10))
    assert parse_corruption("flip:0.1:own") == Corruption(label_flip_ratio=0.1, flip_own_classes=True)
    specs = ("none", "flip:0.1", "flip:0.2:own", "backdoor", "backdoor:target=7",
             "flip:0.3+backdoor:per_batch=10", "backdoor+scale:10", "noise:0.01",
             "replay+count:10000000", "mimic", "mimic:0.5+count:1000", "keep:30+flip:0.5",
             "copy:4")  # fmt: skip
    for spec in specs:
        assert parse_corruption(parse_corruption(spec).describe()) == parse_corruption(spec)
    for bad in (
        "flip",
        "flip:x",
        "flip:1.5",
        "flip:0.1:all",
        "backdoor:7",
        "backdoor:color=1",
        "backdoor:target=a",
        "noise",
        "noise:0",
        "noise:nan",
        "replay:1",
        "mimic:x",
        "mimic:-1",
        "mimic:inf",
        "keep",
        "keep:0",
        "keep:-3",
        "copy",
        "copy:x",
        "copy:-1",
    ):
        with pytest.raises(ValueError):
            parse_corruption(bad)
    with pytest.raises(ValueError, match="per_batch"):
        parse_corruption("backdoor:per_batch=65")


def test_flipping_to_own_classes_stays_within_them() -> None:
    """flip:R:own: a non-IID participant's noisy labels stay among the classes it holds."""
    y = np.array([3] * 40 + [8] * 60)
    flipped = flip_labels(y, 0.1, 10, seed=4, own_classes=True)
    assert set(flipped.tolist()) == {3, 8} and int(np.sum(flipped != y)) == 10
    np.testing.assert_array_equal(flipped, flip_labels(y, 0.1, 10, seed=4, own_classes=True))
    assert np.array_equal(flip_labels(np.full(9, 5), 0.5, 10, seed=0, own_classes=True), np.full(9, 5))
    anywhere = flip_labels(y, 0.5, 10, seed=4)
    assert set(anywhere.tolist()) - {3, 8}  # the paper's noise reaches other classes


def test_free_riders_send_zeros_or_seeded_noise_of_their_norm_and_do_not_train() -> None:
    delta = {"w": torch.ones(50, 4), "steps": torch.tensor(7)}
    replay = parse_corruption("replay")
    assert not replay.trains and not replay.is_clean
    sent = replay.send(delta, seed=1)
    assert float(sent["w"].abs().sum()) == 0 and int(sent["steps"]) == 0
    noise = parse_corruption("noise:0.01")
    first, again = noise.send(delta, seed=3), noise.send(delta, seed=3)
    assert float(first["w"].norm()) == pytest.approx(0.01) and torch.equal(first["w"], again["w"])
    assert not torch.equal(first["w"], noise.send(delta, seed=4)["w"]) and first["w"].dtype == torch.float32
    assert (
        parse_corruption("scale:-3").send(delta, seed=0)["w"][0, 0] == -3
        and parse_corruption("scale:-3").trains
    )


def test_a_mimic_sends_the_federations_own_step_from_the_models_it_received() -> None:
    """mimic: no training; the first time zeros (no step seen), then (w_t - w_s) / (t - s) exactly from
    the last global model it received; mimic:NOISE adds seeded noise of NOISE times the step's norm."""
    like = {"w": torch.zeros(50, 4), "steps": torch.tensor(0)}
    w = {r: {"w": torch.full((50, 4), float(r * r)), "steps": torch.tensor(r)} for r in (1, 3, 4)}
    mimic = parse_corruption("mimic")
    assert not mimic.trains and not mimic.is_clean and mimic.describe() == "mimic"
    assert float(mimic.send(like, 0, w[1], 1)["w"].abs().sum()) == 0
    step = mimic.send(like, 0, w[3], 3)["w"]
    assert torch.equal(step, torch.full((50, 4), (9.0 - 1.0) / 2))
    assert int(mimic.send(like, 0, w[4], 4)["steps"]) == 0
    noisy = parse_corruption("mimic:2")
    noisy.send(like, 5, w[1], 1)
    sent = noisy.send(like, 5, w[3], 3)["w"]
    exact = torch.full((50, 4), 4.0)
    assert float((sent - exact).norm()) == pytest.approx(2 * float(exact.norm()), rel=1e-5)
    again = parse_corruption("mimic:2")
    again.send(like, 5, w[1], 1)
    assert torch.equal(again.send(like, 5, w[3], 3)["w"], sent)  # seeded


def test_keep_leaves_a_member_a_seeded_few_of_its_samples() -> None:
    x = np.arange(100, dtype=np.float32).reshape(100, 1, 1, 1) / 100
    ds = ArrayDataset(x=x, y=np.arange(100) % 10, num_classes=10, name="t")
    kept = parse_corruption("keep:30").apply_to_dataset(ds, seed=3)
    assert len(kept) == 30 and len(set(kept.x.ravel().tolist())) == 30
    assert np.array_equal(kept.y, (np.round(kept.x.ravel() * 100).astype(int)) % 10)  # pairs kept
    assert np.array_equal(kept.x, parse_corruption("keep:30").apply_to_dataset(ds, seed=3).x)
    assert parse_corruption("keep:300").apply_to_dataset(ds, seed=3) is ds
    assert parse_corruption("keep:3").touches_data and not parse_corruption("mimic").touches_data


def test_copy_is_a_second_identity_holding_another_ranks_shard() -> None:
    x = np.arange(120, dtype=np.float32).reshape(120, 1, 1, 1) / 120
    ds = ArrayDataset(x=x, y=np.arange(120) % 10, num_classes=10, name="t")
    splits = DatasetSplits(ds, ds.subset(np.arange(10)), ds.subset(np.arange(10)))
    owner, _ = load_shard(splits, 2, 6, "iid", 0)
    twin, corruption = load_shard(splits, 5, 6, "iid", 0, "copy:2")
    own, _ = load_shard(splits, 5, 6, "iid", 0)
    assert np.array_equal(twin.x, owner.x) and np.array_equal(twin.y, owner.y)
    assert not np.array_equal(own.x, owner.x)
    assert corruption.touches_data and corruption.trains and not corruption.is_clean
    with pytest.raises(ValueError, match="copy:6 names no rank"):
        load_shard(splits, 5, 6, "iid", 0, "copy:6")


def test_a_member_with_made_up_data_trains_on_uniform_inputs_and_labels_and_may_add_the_step() -> None:
    rng = np.random.default_rng(0)
    real = ArrayDataset(
        rng.uniform(0.2, 0.6, (50, 1, 4, 4)).astype(np.float32), np.zeros(50, np.int64), 10, "t"
    )
    spec = parse_corruption("madeup+step")
    assert spec.made_up and spec.adds_step and spec.trains and spec.touches_data
    assert parse_corruption(spec.describe()) == spec
    made = spec.apply_to_dataset(real, seed=3)
    assert made.x.shape == real.x.shape and made.x.dtype == real.x.dtype
    assert made.x.min() >= 0.2 and made.x.max() <= 0.6 and not np.allclose(made.x, real.x)
    assert len(np.unique(made.y)) > 5  # labels over every class, not the member's one
    again = spec.apply_to_dataset(real, seed=3)
    assert np.array_equal(again.x, made.x) and np.array_equal(again.y, made.y)  # seeded
    x = np.arange(120, dtype=np.float32).reshape(120, 1, 1, 1) / 119  # the simulation's shard is made up
    ds = ArrayDataset(x=x, y=np.zeros(120, np.int64), num_classes=10, name="t")
    splits = DatasetSplits(ds, ds.subset(np.arange(10)), ds.subset(np.arange(10)))
    own, _ = load_shard(splits, 2, 6, "iid", 0, "none")
    shard, _ = load_shard(splits, 2, 6, "iid", 0, "madeup")
    assert shard.x.shape == own.x.shape and not np.array_equal(shard.x, own.x)
    assert len(np.unique(shard.y)) > 5 and len(np.unique(own.y)) == 1
    delta = {"w": torch.ones(3)}
    first = spec.send(delta, 0, {"w": torch.zeros(3)}, round=1)  # no step seen yet: the delta alone
    assert torch.equal(first["w"], torch.ones(3))
    later = spec.send(delta, 0, {"w": torch.full((3,), 4.0)}, round=3)  # step (4 - 0) / 2 added
    assert torch.equal(later["w"], torch.full((3,), 3.0))
