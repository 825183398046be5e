"""The translation-model base (fadat.models.architectures.TranslationModel): abstract hooks,
defaults, and the capabilities that translate / evaluate / serve / validation branch on."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fadat.data.contract import EOS_ID, PAD_ID
from fadat.errors import InputError
from fadat.models.architectures import ARCHITECTURES, BatchScores, TranslationModel, model_class
from fadat.models.config import make_config
from fadat.models.transformer import Decoder, Encoder, decoder_input
from fadat.training.config import TrainConfig


def tiny(model_type: str) -> TranslationModel:
    torch.manual_seed(0)
    return model_class(model_type)(make_config("tiny", 12, model_type=model_type)).eval()


def test_a_model_must_write_translate_and_score():
    class Half(TranslationModel):
        model_type = "nat"

        def translate_batch(self, source, strategy, options, nbest=1):
            return [[([], 0.0)] for _ in range(source.shape[0])]

    with pytest.raises(TypeError, match="score_batch"):
        Half(make_config("tiny", 12, model_type="nat"))


def test_an_argmax_model_in_a_few_lines_gets_the_whole_interface():
    """What docs/extending.md promises: a subclass that writes its network, translate_batch and
    score_batch gets the strategies, option checks, sizes and batching of the base."""

    class Copy(TranslationModel):
        model_type = "ctc"  # a registered name, so that the config validates

        def __init__(self, config):
            super().__init__(config)
            self.encoder = Encoder(config)
            self.decoder = Decoder(config, copy_source=True)

        def translate_batch(self, source, strategy, options, nbest=1):
            lengths = self.graph_lengths(source.ne(PAD_ID).sum(dim=1), decoding=True)
            states = self.decoder(
                self.encoder.embed_tokens, self.encode(source), decoder_input(lengths)
            )
            best = torch.log_softmax(states @ self.output_weight.T, -1).max(-1)  # (B, L)
            rows = zip(best.indices.tolist(), lengths.tolist(), strict=True)
            return [[(row[1 : n - 1], 0.0)] for row, n in rows]

        def score_batch(self, source, target, target_lengths):
            return BatchScores([0.0] * len(source), [0] * len(source), [None] * len(source))

    model = Copy(make_config("tiny", 12, model_type="ctc", upsample_ratio=2.0)).eval()
    source = torch.tensor([[5, 6, EOS_ID], [7, EOS_ID, PAD_ID]])
    assert model.strategies() == {"argmax": ()}
    model.check_options("argmax", {})
    with pytest.raises(ValueError, match="takes no options"):
        model.check_options("argmax", {"beta": 1.0})
    with pytest.raises(ValueError, match="one hypothesis"):
        model.check_options("argmax", {}, nbest=2)
    assert model.graph_lengths(torch.tensor([3, 2])).tolist() == [6, 4]
    assert model.batch_cost(3) == 6 and model.length_budget() == (2.0, 256)
    assert model.usable([64, 65], [3, 3]).tolist() == [True, False]
    assert [len(h[0][0]) for h in model.translate_batch(source, "argmax", {})] == [4, 2]
    assert not model.has_graph and model.precisions == ("fp32",) and not model.reduced_head


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_validation_options_name_train_config_fields_the_strategy_takes(model_type):
    model = tiny(model_type)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    accepted = model.strategies()[model.validation_strategy]
    for option, field in model.validation_options.items():
        assert option in accepted and field in fields
    assert model.default_strategy in model.strategies()


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_precision_and_reduced_head_follow_the_capabilities(model_type, tmp_path):
    from fadat.translation.pipeline import apply_precision, apply_reduced_head

    model = tiny(model_type)
    for precision in ("bf16", "int8"):
        if precision in model.precisions:
            assert apply_precision(model, precision).inference_precision == precision
        else:
            with pytest.raises(InputError, match=f"precision='{precision}' is for DAT models"):
                apply_precision(model, precision)
    if model.reduced_head:
        assert apply_reduced_head(model, tmp_path, prune_threshold=0.5) is model
    else:
        with pytest.raises(InputError, match="prune_threshold are for DAT models"):
            apply_reduced_head(model, tmp_path, prune_threshold=0.5)
    # only the DAT has a graph (graph_outputs) to draw
    assert model.has_graph == callable(getattr(model, "graph_outputs", None))
    assert {t for t in ARCHITECTURES if model_class(t).has_graph} == {"dat"}
