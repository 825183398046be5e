"""fadat.evaluation.distillation: the statistics of a distilled training set, against counts
made here from the two datasets, and its refusal of datasets that do not correspond."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_distill import generated

from fadat.data.binarized import BinarizedDataset
from fadat.errors import InputError
from fadat.evaluation.distillation import distillation_statistics
from fadat.translation.distill import distill


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    gen = generated(str(tmp_path_factory.getbasetemp() / "distill-gen"))
    out = tmp_path_factory.getbasetemp() / "distill-stats"
    result = distill(
        gen["at"], gen["data"], out, beam=2, batch_size=32, engine="fadat", progress=False
    )
    return gen["data"], result.output, result


def test_distill_records_the_statistics(datasets):
    """fadat distill computes them from its targets in memory: equal to the statistics of the
    written dataset, in meta.json and on the result; a reused dataset returns them too."""
    original, kd, result = datasets
    again = distillation_statistics(original, kd)
    assert result.statistics == again
    meta = json.loads((kd / "meta.json").read_text(encoding="utf-8"))
    assert meta["distilled"]["statistics"] == again.as_dict()
    gen_dirs = {"at": Path(meta["distilled"]["settings"]["teacher"]), "data": original}
    reused = distill(
        gen_dirs["at"], original, kd, beam=2, batch_size=32, engine="fadat", progress=False
    )
    assert reused.reused and reused.statistics == again


def test_statistics_count_what_changed(datasets):
    original, kd, _ = datasets
    stats = distillation_statistics(original, kd)
    before, after = BinarizedDataset(original, "train"), BinarizedDataset(kd, "train")
    changed = sum(not np.array_equal(before[i][1], after[i][1]) for i in range(len(before)))
    pieces = [int(sum(d.target_lengths) - 2 * len(d)) for d in (before, after)]
    assert stats.pairs == 300 and stats.changed == changed and 0 < changed <= 300
    assert stats.changed_share == pytest.approx(changed / 300)
    assert (stats.reference_pieces, stats.distilled_pieces) == tuple(pieces)
    assert stats.length_ratio == pytest.approx(pieces[1] / pieces[0])
    assert 0.0 <= stats.bleu < 100.0 and "BLEU" in stats.summary()
    same = distillation_statistics(original, original)  # a dataset against itself
    assert same.changed == 0 and same.length_ratio == 1.0 and same.bleu == pytest.approx(100.0)
    assert set(stats.as_dict()) >= {"pairs", "changed", "length_ratio", "bleu", "tok_bleu"}


def test_statistics_refuse_datasets_that_do_not_correspond(datasets, tmp_path):
    original, kd, _ = datasets
    other = tmp_path / "other"
    shutil.copytree(kd, other)
    ids = np.load(other / "train.src.ids.npy")
    ids[0] = (int(ids[0]) + 1) % 16
    np.save(other / "train.src.ids.npy", ids)
    with pytest.raises(InputError, match="source of training pair 0 differs"):
        distillation_statistics(original, other)
    shutil.copyfile(original / "spm.model", other / "spm.model")
    (other / "spm.model").write_bytes(b"not a model")
    with pytest.raises(InputError, match="another sentencepiece model"):
        distillation_statistics(original, other)
