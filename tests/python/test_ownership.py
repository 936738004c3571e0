"""Owner resolution and DataLoader re-creation, in one process (a world of one):
what counts as rank-aware, what the config forces, what the runtime refuses, and
that the managed loader keeps the user's DataLoader class and arguments."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, IterableDataset, RandomSampler, Subset

import ddplug
from ddplug import errors
from ddplug.data import ownership
from ddplug.data.declarations import allowance, declare
from ddplug.data.streams import DataSplit, StreamBatchSampler

from conftest import TEST_PLUGIN, config, run_ranks


class Items(Dataset):
    def __init__(self, n: int = 20) -> None:
        self.n = n
        self.lengths = [5 + (i * 7) % 40 for i in range(n)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Stream(IterableDataset):
    def __iter__(self):
        yield from range(5)


class DuckSampler(torch.utils.data.Sampler):
    """Rank-aware by convention only (GPT-SoVITS style)."""

    def __init__(self, n: int) -> None:
        self.n, self.num_replicas, self.rank = n, 1, 0

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


class MyLoader(DataLoader):
    """A DataLoader subclass with an extra argument, as users write them."""

    def __init__(self, dataset, batch_size, tag, **kw) -> None:
        self.tag = tag
        super().__init__(dataset, batch_size=batch_size, **kw)


def ctx_with(**sections) -> ddplug.Context:
    cfg = {"plugin": TEST_PLUGIN}
    cfg.update(sections)
    return ddplug.Context(cfg, framework="test")


@pytest.fixture
def ctx():
    c = ctx_with()
    yield c
    c.close()


def split(ctx: ddplug.Context, lines: list) -> DataSplit:
    return DataSplit(ctx, "test", log=lines.append)


def test_what_counts_as_rank_aware() -> None:
    ds = Items()
    assert "DistributedSampler" in ownership.why_rank_aware(DistributedSampler(ds, num_replicas=2, rank=0))
    assert ownership.why_rank_aware(DuckSampler(3)) == "exposes num_replicas=1, rank=0"
    assert ownership.why_rank_aware(RandomSampler(ds)) is None
    declared = ownership.rank_aware(RandomSampler(ds))
    assert ownership.why_rank_aware(declared) == "declared rank-aware"
    assert ownership.why_rank_aware(ownership.rank_aware(DuckSampler(3), False)) is None
    # batch_sampler= is looked at (Lightning looks only at .sampler)
    vits = DataLoader(ds, batch_sampler=BatchSampler(DistributedSampler(ds, 2, 0), 2, False))
    where, obj, why = ownership.find_rank_aware(vits)
    assert where == "batch_sampler.sampler" and isinstance(obj, DistributedSampler)
    assert ownership.find_rank_aware(DataLoader(ds, batch_size=2, shuffle=True)) == (None, None, None)


def test_plain_loader_becomes_plugin_owned_and_keeps_its_class(ctx: ddplug.Context) -> None:
    lines: list = []
    loader = MyLoader(Items(), 4, "mine", collate_fn=lambda b: torch.tensor(b), drop_last=False)
    managed = split(ctx, lines).prepare(loader, "train")
    assert type(managed) is MyLoader and managed.tag == "mine"
    assert isinstance(managed.batch_sampler, StreamBatchSampler) and managed.batch_sampler.owner == "plugin"
    batches = [b.tolist() for b in managed]
    assert sorted(i for b in batches for i in b) == list(range(20)) and len(batches) == 5
    # the position is the stream's (a Trainer checkpoint stores it under "ddplug"),
    # not the loader's: a stateful loader would tie checkpoints to this strategy
    assert not hasattr(managed, "state_dict") and managed.batch_sampler.state_dict()["position"] == 5
    assert "owner plugin (auto" in lines[0] and "5 batches per epoch" in lines[0]


def test_positional_arguments_are_replaced_in_place(ctx: ddplug.Context) -> None:
    from lightning.fabric.utilities.data import _replace_dunder_methods

    with _replace_dunder_methods(DataLoader, "dataset"):  # as Lightning's hooks capture them
        loader = DataLoader(Items(), 3, True)
    managed = split(ctx, []).prepare(loader, "train")
    assert sorted(i for b in managed for i in b.tolist()) == list(range(20))
    assert len(managed) == 7


def test_rank_aware_sampler_is_left_alone(ctx: ddplug.Context) -> None:
    sampler = DuckSampler(20)
    managed = split(ctx, []).prepare(DataLoader(Items(), batch_size=5, sampler=sampler), "train")
    stream = managed.batch_sampler
    assert stream.owner == "user" and "DuckSampler: exposes num_replicas=1" in stream.decision.reason
    assert [b.tolist() for b in managed] == [list(range(k, k + 5)) for k in range(0, 20, 5)]


def test_iterable_dataset_is_user_owned(ctx: ddplug.Context) -> None:
    lines: list = []
    loader = DataLoader(Stream(), batch_size=2)
    with pytest.warns(errors.DdplugWarning, match="not audited: its samples carry no id"):
        assert split(ctx, lines).prepare(loader, "train") is loader
    assert lines[0].startswith("WARNING: stream 'train': owner user") and "IterableDataset" in lines[0]


def test_config_forces_owner_and_conflicting_claims_fail() -> None:
    c = ctx_with(data_split={"streams": {"train": {"owner": "plugin"}}})
    try:
        ds = Items()
        forced = split(c, []).prepare(DataLoader(ds, batch_size=4, sampler=DuckSampler(20)), "train")
        assert forced.batch_sampler.owner == "plugin"
        assert forced.batch_sampler.decision.forced_by.startswith("data_split.streams.train.owner")
        # "val" is auto: a rank-aware sampler makes it user-owned, then a plain loader
        # claiming the same stream for the plugin is a conflict naming both claimants
        s = split(c, [])
        s.prepare(DataLoader(ds, batch_size=4, sampler=DuckSampler(20)), "val")
        with pytest.raises(errors.SplitConflict) as e:
            s.prepare(DataLoader(ds, batch_size=4), "val")
        assert "user" in str(e.value) and "plugin" in str(e.value)
    finally:
        c.close()


def test_iterable_dataset_cannot_be_forced_to_plugin() -> None:
    c = ctx_with(data_split={"owner": "plugin"})
    try:
        with pytest.raises(ValueError, match="only the dataset itself can split"):
            split(c, []).prepare(DataLoader(Stream(), batch_size=2), "train")
    finally:
        c.close()


def test_bucket_kind_needs_lengths() -> None:
    c = ctx_with(sampler={"kind": "bucket", "bucket": {"batch_size": 4, "num_buckets": 2}})
    try:
        class NoLengths(Dataset):
            def __len__(self) -> int:
                return 8

            def __getitem__(self, i: int) -> int:
                return i

        with pytest.raises(ValueError, match="needs per-sample lengths"):
            split(c, []).prepare(DataLoader(NoLengths(), batch_size=2), "train")
        managed = split(c, []).prepare(DataLoader(Items(), batch_size=2), "train")
        assert all(len(b) == 4 for b in managed)
    finally:
        c.close()


def test_resume_position_and_epoch(ctx: ddplug.Context) -> None:
    managed = split(ctx, []).prepare(DataLoader(Items(), batch_size=4, shuffle=True), "train")
    stream = managed.batch_sampler
    stream.set_epoch(3)
    full = [b.tolist() for b in managed]
    stream.load_state_dict({"ddplug_stream": "train", "epoch": 3, "position": 2, "world_size": 1})
    assert [b.tolist() for b in managed] == full[2:]
    assert stream.state_dict()["epoch"] == 3
    stream.load_state_dict({"ddplug_stream": "train", "epoch": 3, "position": 5, "world_size": 1})
    assert [b.tolist() for b in managed] != full, "a finished epoch resumes at the next one"


def test_only_explicit_declarations_allow_padding_and_dropping() -> None:
    ds = Items(10)
    # torch's own DistributedSampler: its documented padding (10 on 4 ranks: 2),
    # or with drop_last its dropped tail — from N and the world, not from len()
    a = allowance(10, [DistributedSampler(ds, num_replicas=4, rank=0)], None, evaluation=False)
    assert (a.padding, a.dropped) == (2, 0) and "torch's DistributedSampler" in a.source
    a = allowance(10, [DistributedSampler(ds, num_replicas=4, rank=0, drop_last=True)], None, evaluation=False)
    assert (a.padding, a.dropped) == (0, 2)
    # a subclass that changes __iter__ is not taken at its word, whatever its length says

    class Half(DistributedSampler):
        def __iter__(self):
            return iter([i for i in super().__iter__() if i < 5])

        def __len__(self) -> int:
            return 2

    a = allowance(10, [Half(ds, num_replicas=2, rank=0)], None, evaluation=False)
    assert (a.padding, a.dropped, a.local_dropped) == (0, 0, 0)
    # a batching that drops its last partial batch: this rank's remainder
    inner = BatchSampler(DistributedSampler(ds, num_replicas=4, rank=0), 2, True)  # 3 per rank -> 1 left
    assert allowance(10, [inner.sampler], inner, evaluation=False).local_dropped == 1
    # every rank reads everything: nothing is allowed, the audit must see it
    assert allowance(10, [RandomSampler(ds)], BatchSampler(RandomSampler(ds), 2, False),
                     evaluation=False).describe() == "nothing"
    # declared: padding by count, dropped by index, by predicate or by count
    s = declare(DuckSampler(10), padding=3, dropped=[7, 2, 7])
    a = allowance(10, [s], s, evaluation=False)
    assert a.padding == 3 and a.dropped_indices.tolist() == [2, 7] and "declared on DuckSampler" in a.source
    s = declare(DuckSampler(10), dropped=lambda i: i % 4 == 0)
    assert allowance(10, [s], s, evaluation=False).dropped_indices.tolist() == [0, 4, 8]
    assert allowance(10, [declare(DuckSampler(10), dropped=2)], None, evaluation=False).dropped == 2
    # an evaluation stream declares nothing, whatever the sampler says
    assert allowance(10, [s], s, evaluation=True).describe() == "nothing"
    with pytest.raises(ValueError, match="padding must be >= 0"):
        declare(DuckSampler(3), padding=-1)


def test_stream_names_are_the_librarys_rule(ctx: ddplug.Context) -> None:
    assert ownership.check_stream_name("val.en-2_x") == "val.en-2_x"
    with pytest.raises(ValueError, match="stream name 'tr ain' has character ' ' at 2"):
        ownership.check_stream_name("tr ain")
    with pytest.raises(ValueError, match="must have 1 to 63 characters"):
        split(ctx, []).prepare(DataLoader(Items(), batch_size=2), "x" * 64)
    from ddplug.fabric import name_stream

    with pytest.raises(ValueError, match="has character '/'"):
        name_stream(DataLoader(Items()), "a/b")


def test_the_forced_owner_is_the_librarys_answer() -> None:
    cfg = {"data_split": {"owner": "user", "streams": {"val": {"owner": "auto"},
                                                        "test": {"sampler": {"shuffle": False}}}}}
    c = ctx_with(**cfg)
    try:
        assert ownership.forced_owner(c, "train") == ("user", "data_split.owner in <dict>")
        assert ownership.forced_owner(c, "val") == (None, None)  # its own "auto" wins
        assert ownership.forced_owner(c, "test") == ("user", "data_split.owner in <dict>")
    finally:
        c.close()


def test_config_helper_is_valid_json() -> None:
    from conftest import config

    assert json.loads(config(sampler={"seed": 1}))["sampler"] == {"seed": 1}


def test_sampler_settings_per_stream_and_exact_evaluation() -> None:
    c = ctx_with(sampler={"kind": "bucket", "seed": 4, "bucket": {"batch_size": 4, "num_buckets": 2}},
                 data_split={"streams": {"train": {"sampler": {"bucket": {"batch_size": 2}}},
                                         "val": {"sampler": {"shuffle": True}},
                                         "test": {"sampler": {"kind": "bucket"}}}})
    try:
        s = split(c, [])
        train = s.sampler_settings("train")
        assert train["kind"] == "bucket" and train["bucket"] == {"batch_size": 2, "num_buckets": 2, "pad": "repeat"}
        assert train["seed"] == 4 and train["exact"] is False
        val = s.sampler_settings("val")  # the top-level bucketing does not reach evaluation
        assert val["kind"] == "distributed" and val["exact"] is True and val["shuffle"] is True and val["seed"] == 4
        with pytest.raises(ValueError, match=r"'test' is an evaluation stream.*sampler.kind = \"bucket\""):
            s.sampler_settings("test")
        managed = s.prepare(DataLoader(Items(), batch_size=3), "predict")
        stream = managed.batch_sampler
        assert stream.evaluation and stream.index_sampler.exact
        assert sorted(i for b in managed for i in b.tolist()) == list(range(20))
    finally:
        c.close()


def test_shard_splits_by_rank_and_worker() -> None:
    from ddplug.data.iterable import shard

    src = list(range(23))
    parts = [list(shard(src, rank=r, world_size=3)) for r in range(3)]
    assert sorted(i for p in parts for i in p) == src and parts[1][:3] == [1, 4, 7]
    assert [len(shard(src, rank=r, world_size=3)) for r in range(3)] == [8, 8, 7]
    loaders = [list(DataLoader(shard(src, rank=r, world_size=2), batch_size=None, num_workers=2)) for r in range(2)]
    assert sorted(int(i) for p in loaders for i in p) == src, "every item once over ranks x workers"
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        shard(src, rank=2, world_size=2)


class Keyed(IterableDataset):
    def __init__(self, keys: list) -> None:
        self.keys = keys

    def __iter__(self):
        for k in self.keys:
            yield {"__key__": k, "v": 0}


def test_an_iterable_is_audited_by_id(ctx: ddplug.Context) -> None:
    lines: list = []
    s = DataSplit(ctx, "test", log=lines.append)
    ok = s.prepare(DataLoader(ddplug.declare(Keyed([f"k{i}" for i in range(10)]), key="__key__"), batch_size=3),
                   "train")
    assert [len(b["__key__"]) for b in ok] == [3, 3, 3, 1]
    ids = s.iterables["train"]
    assert [r.verdict for r in ids.reports] == ["PASS"] and ids.reports[0].covered == 10
    bad = s.prepare(DataLoader(ddplug.declare(Keyed(["a", "b", "a", "c"]), key=lambda b: b["__key__"]),
                               batch_size=2), "train.1")
    with pytest.raises(errors.AuditFailed) as e:
        list(bad)
    assert "repeated samples: 1 delivery repeated a sample already delivered" in str(e.value)
    assert "Repeated sample keys: a" in str(e.value)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # webdataset leaves its tar open when a pass stops
def test_a_webdatasets_key_is_found_where_its_pipeline_puts_it(ctx: ddplug.Context, tmp_path) -> None:
    """WebDataset: "__key__" in the sample dict, moved to a position by to_tuple,
    dropped by a to_tuple (not audited, and the warning names the fix), and lost in
    a map ddplug cannot see into (the audit stops with a warning instead of
    failing the epoch); a declared key that is wrong is an error naming it."""
    import warnings

    import torch
    import webdataset as wds
    from ddplug.data.iterable import key_of, webdataset_key

    tar = str(tmp_path / "s.tar")
    with wds.TarWriter(tar) as sink:
        for i in range(7):
            sink.write({"__key__": f"k{i}", "x.pth": torch.tensor([float(i)])})

    def pipe():
        return wds.WebDataset([tar], shardshuffle=False, empty_check=False).decode()

    assert key_of(pipe()) == "__key__"
    assert key_of(pipe().to_tuple("x.pth", "__key__")) == 1
    dropped = pipe().to_tuple("x.pth")
    assert key_of(dropped) is None and "to_tuple('x.pth') drops \"__key__\"" in webdataset_key(dropped)[1]

    s = DataSplit(ctx, "test", log=lambda line: None)
    moved = s.prepare(DataLoader(pipe().to_tuple("x.pth", "__key__"), batch_size=3), "train")
    assert sum(len(b[1]) for b in moved) == 7
    assert [r.verdict for r in s.iterables["train"].reports] == ["PASS"]
    assert s.iterables["train"].reports[0].covered == 7
    with pytest.warns(UserWarning, match="drops \"__key__\": name it there"):
        s.prepare(DataLoader(dropped, batch_size=3), "train.1")
    lost = s.prepare(DataLoader(pipe().map(lambda d: d["x.pth"]), batch_size=3), "train.2")
    with pytest.warns(UserWarning, match="stream 'train.2': not audited from here on"):
        assert sum(len(b) for b in lost) == 7
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sum(len(b) for b in lost) == 7, "stopped: no audit, no second warning"
    assert s.iterables["train.2"].reports == []
    wrong = s.prepare(DataLoader(ddplug.declare(pipe(), key="path"), batch_size=3), "train.3")
    with pytest.raises(ValueError, match="stream 'train.3': the declared key 'path' finds no ids in a batch"):
        list(wrong)


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_stops_auditing_when_one_finds_no_key(tmp_path, world: int) -> None:
    """A key ddplug found itself (WebDataset's) goes missing on rank 0 only (a map
    it cannot see into), and the last rank gets no batch, so it cannot notice:
    every rank still stops auditing at the same pass end, with a warning, instead
    of the last rank waiting alone in the audit's collective finish until the
    collective timeout."""
    cfg = config(timeouts={"collective_s": 10})
    codes, outs = run_ranks("ctx_worker.py", world, "iterable-stop", cfg, out_dir=tmp_path)
    assert codes == [0] * world, "\n".join(outs)[-6000:]
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for r, rank in enumerate(res):
        assert rank["stopped"] and rank["reports"] == 0, rank
        assert len(rank["warnings"]) == 1 and "not audited from here on" in rank["warnings"][0], rank
        assert rank["seen"] == ([6, 6] if r == 0 else [0, 0] if r == world - 1 else [2, 2]), rank
    assert "another rank's batches carry no" in res[world - 1]["warnings"][0]


def test_sharded_datasets_map_to_their_root() -> None:
    """Subset chains and a Hugging Face dataset's indices mapping (what
    split_dataset_by_node and .shard() leave) map local indices to the root's."""
    import numpy as np

    ds = Items(10)
    mapping, root_n, root = ownership._subset_chain(Subset(Subset(ds, range(1, 10, 2)), [0, 2, 4]))
    assert mapping.tolist() == [1, 5, 9] and root_n == 10 and root is ds
    assert ownership._subset_chain(ds) == (None, -1, ds)

    class Column:
        def __init__(self, v):
            self.v = v

        def to_numpy(self):
            return np.asarray(self.v)

    class Table:
        num_rows = 1000

        def __init__(self, v=None):
            self.v = v

        def column(self, i):
            return Column(self.v)

    class FakeHF:  # the attributes datasets.Dataset has
        _fingerprint = "abc123"

        def __init__(self, idx):
            self._indices = Table(idx)
            self._data = Table()

        def __len__(self):
            return len(self._indices.v)

    mapping, root_n, _ = ownership._subset_chain(Subset(FakeHF(list(range(1, 1000, 2))), [0, 1]))
    assert mapping.tolist() == [1, 3] and root_n == 1000
