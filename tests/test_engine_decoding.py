"""The numpy decoders (fadat.engine.decoding_np) against the torch decoders on the same graphs
and against brute force: paths and tokens equal, scores within float rounding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_decoding import exhaustive_viterbi, hand_walk, random_graph

from fadat.data.contract import PAD_ID
from fadat.decoding import VertexTop1, decode, path_score
from fadat.engine import decoding_np

ROOT = Path(__file__).resolve().parent.parent

CASES = [
    ("greedy", {}),
    ("lookahead", {}),
    ("lookahead", {"beta": 0.0}),
    ("lookahead", {"beta": 2.5}),
    ("viterbi", {}),
    ("viterbi", {"length_penalty": 0.0}),
    ("viterbi", {"length_penalty": 1.3, "max_length": 3}),
    ("joint-viterbi", {}),
    ("joint-viterbi", {"length_penalty": 0.7}),
    ("joint-viterbi", {"max_length": 2}),
]


def top1_numpy(tlp: torch.Tensor, dtype) -> tuple[np.ndarray, np.ndarray]:
    s, tok = tlp.max(-1)  # (B, L), (B, L)
    return s.numpy().astype(dtype), tok.numpy()


def test_pad_id_is_the_contracts():
    assert decoding_np.PAD_ID == PAD_ID


@pytest.mark.parametrize(("strategy", "options"), CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_decoders_equal_the_torch_decoders(strategy, options, dtype):
    """Randomized: 20 padded batches per case (graph sizes 2 to 12, sharp and flat graphs);
    the torch decoder reads the same VertexTop1, in the same dtype."""
    tdtype = torch.float32 if dtype == np.float32 else torch.float64
    for seed in range(20):
        sharp = 0.3 if seed % 2 else 2.0
        tlp, ln, lens = random_graph(7, 12, 9, seed=1000 + seed, sharp=sharp)
        s, tok = top1_numpy(tlp, dtype)
        links = ln.numpy().astype(dtype)
        want = decode(
            VertexTop1(torch.from_numpy(s), torch.from_numpy(tok)),
            torch.from_numpy(links).to(tdtype),
            lens,
            strategy,
            **options,
        )
        got = decoding_np.decode(s, tok, links, lens.numpy(), strategy, **options)
        for g, w in zip(got, want, strict=True):
            assert (g.path, g.path_tokens, g.tokens) == (w.path, w.path_tokens, w.tokens)
            # float32: the sums' order differs (numpy pairwise, torch sequential/vectorised)
            assert g.score == pytest.approx(w.score, rel=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("strategy", ["greedy", "lookahead", "viterbi", "joint-viterbi"])
def test_ties_break_as_in_torch(strategy):
    """Links and scores rounded to a coarse grid make many exact ties: the first index wins in
    both."""
    for seed in range(10):
        tlp, ln, lens = random_graph(6, 9, 5, seed=2000 + seed)
        s, tok = top1_numpy(tlp, np.float32)
        s = np.round(s * 2) / 2
        links = np.round(ln.numpy().astype(np.float32) * 2) / 2
        want = decode(
            VertexTop1(torch.from_numpy(s), torch.from_numpy(tok)),
            torch.from_numpy(links),
            lens,
            strategy,
        )
        got = decoding_np.decode(s, tok, links, lens.numpy(), strategy)
        assert [g.path for g in got] == [w.path for w in want]


@pytest.mark.parametrize("beta", [None, 0.5, 1.0, 2.0])
def test_greedy_and_lookahead_equal_the_hand_walk(beta):
    tlp, ln, lens = random_graph(12, 9, 6, seed=1)
    s, tok = top1_numpy(tlp, np.float64)
    links = ln.numpy()
    if beta is None:
        hyps = decoding_np.greedy(s, tok, links, lens.numpy())
    else:
        hyps = decoding_np.lookahead(s, tok, links, lens.numpy(), beta=beta)
    for b, h in enumerate(hyps):
        n = int(lens[b])
        assert h.path == hand_walk(tlp[b], ln[b], n, beta)
        assert h.path_tokens == [int(tlp[b, v].argmax()) for v in h.path]
        assert h.tokens == decoding_np.output_tokens(h.path_tokens)
        assert h.score == pytest.approx(path_score(tlp[b], ln[b], h.path, h.path_tokens))


@pytest.mark.parametrize("strategy", ["viterbi", "joint-viterbi"])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 1.7])
@pytest.mark.parametrize("max_length", [None, 2])
def test_viterbi_equals_exhaustive_search(strategy, beta, max_length):
    tlp, ln, lens = random_graph(10, 8, 5, seed=2)
    s, tok = top1_numpy(tlp, np.float64)
    hyps = decoding_np.decode(
        s, tok, ln.numpy(), lens.numpy(), strategy, length_penalty=beta, max_length=max_length
    )
    for b, h in enumerate(hyps):
        n = int(lens[b])
        joint = strategy == "joint-viterbi"
        assert h.path == exhaustive_viterbi(tlp[b], ln[b], n, joint, beta, max_length)
        assert h.score == pytest.approx(path_score(tlp[b], ln[b], h.path, h.path_tokens))


@pytest.mark.parametrize("strategy", list(decoding_np.STRATEGIES))
def test_two_vertex_graphs_in_a_padded_batch(strategy):
    tlp, ln, lens = random_graph(3, 6, 4, lengths=[2, 6, 2], seed=3)
    s, tok = top1_numpy(tlp, np.float32)
    hyps = decoding_np.decode(s, tok, ln.numpy().astype(np.float32), lens.numpy(), strategy)
    assert hyps[0].path == [0, 1] and hyps[0].tokens == []
    assert hyps[2].path == [0, 1] and hyps[2].tokens == []


def test_output_tokens_is_the_one_rule():
    from fadat.decoding import output_tokens

    for tokens in ([0, 5, 5, 6, 2], [0, 5, PAD_ID, 5, 2], [0, 2], [5, 5, 2], [0, 0, 3, 2]):
        assert output_tokens(tokens) == decoding_np.output_tokens(tokens)
    assert decoding_np.output_tokens([0, 5, PAD_ID, 5, 2]) == [5, 5]


def test_bad_inputs_and_options():
    tlp, ln, lens = random_graph(2, 5, 4, seed=5)
    s, tok = top1_numpy(tlp, np.float32)
    links = ln.numpy().astype(np.float32)
    with pytest.raises(ValueError, match="not available"):
        decoding_np.decode(s, tok, links, lens.numpy(), "beam")
    with pytest.raises(ValueError, match="no_repeated_ngram"):
        decoding_np.decode(s, tok, links, lens.numpy(), "lookahead", no_repeated_ngram=2)
    with pytest.raises(ValueError, match="max_length"):
        decoding_np.viterbi(s, tok, links, lens.numpy(), max_length=0)
    with pytest.raises(ValueError, match="graph lengths"):
        decoding_np.greedy(s, tok, links, np.array([1, 5]))
    with pytest.raises(ValueError, match="links must be"):
        decoding_np.greedy(s, tok, links[:, :4], lens.numpy())


BLOCK_TORCH = (
    "import sys\n"
    "class _NoTorch:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'torch' or name.startswith('torch.'):\n"
    "            raise ImportError('torch is blocked in this test')\n"
    "sys.meta_path.insert(0, _NoTorch())\n"
)


def test_the_engine_modules_import_without_torch():
    """The engine's modules import without torch, and without numba and kenlm (the beam search
    imports them when it runs); the beam search then runs without torch, its numba compiled
    search loaded from numba's cache or compiled."""
    code = BLOCK_TORCH + (
        "import fadat.engine, fadat.engine.decoding_np, fadat.engine.beam_np\n"
        "import fadat.engine.runtime\n"
        "assert not {'torch', 'numba', 'kenlm'} & set(sys.modules), sys.modules.keys()\n"
        "import numpy as np\n"
        "from fadat.engine.beam_np import beam_search\n"
        "lp = np.log(np.full((1, 5, 2), 0.5, dtype=np.float32))\n"
        "tok = np.tile(np.array([4, 5]), (1, 5, 1))\n"
        "ln = np.triu(np.zeros((1, 5, 5), dtype=np.float32), 1)\n"
        "ln[ln == 0] = -np.inf\n"
        "ln[0, np.arange(4), np.arange(1, 5)] = 0.0\n"
        "(h,) = beam_search(lp, tok, ln, np.array([5]), top_cand_n=2)\n"
        # J([4, 5, 4]) = log(1/8) / 3^1.1 beats log(2/8) / 2^1.1 of [4, 5]; [5, 4, 5] ties
        "assert h.path == [0, 1, 2, 3, 4] and h.tokens == [4, 5, 4], h\n"
        "assert 'torch' not in sys.modules and 'numba' in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "ok"
