"""The one table of decoding options (fadat.options.DECODING_OPTIONS) and its three readers: the
command-line flags, the Python API's check and the HTTP request fields of ``fadat serve``. The
names, flags, types and ranges below are the interface as it was before the table existed (the
CLI table of fadat.cli.common and the HTTP table of fadat.serve.engine); they must not change."""

from __future__ import annotations

import argparse

import pytest

from fadat.cli.common import add_decoding_arguments, decoding_options
from fadat.errors import InputError
from fadat.options import (
    DECODING_OPTIONS,
    finite_float,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    random_seed,
)
from fadat.serve.engine import Engine
from fadat.translation.pipeline import check_option_values

#: keyword → (CLI flag or None, CLI value type, HTTP kind, HTTP range), CLI flags in --help order.
INTERFACE = {
    "beta": ("--beta", finite_float, float, (0.0, 100.0)),
    "length_penalty": ("--length-penalty", finite_float, float, (-10.0, 10.0)),
    "temperature": ("--temperature", positive_float, float, (1e-3, 100.0)),
    "top_cand_n": ("--top-cand-n", positive_int, int, (1, 100)),
    "top_p": ("--top-p", finite_float, float, (0.0, 1.0)),
    "seed": ("--seed", random_seed, int, (0, 2**63 - 1)),
    "beam_size": ("--beam-size", positive_int, int, (1, 200)),
    "max_beam_per_length": ("--max-beam-per-length", positive_int, int, (1, 100)),
    "gamma": ("--gamma", finite_float, float, (-10.0, 10.0)),
    "no_consecutive_repeated_ngram": (
        "--no-consecutive-repeated-ngram",
        nonnegative_int,
        int,
        (0, 10),
    ),
    "no_repeated_ngram": ("--no-repeated-ngram", nonnegative_int, int, (0, 10)),
    "max_length": ("--max-length", positive_int, int, (1, 1024)),
    "max_len_a": ("--max-len-a", nonnegative_float, float, (0.0, 10.0)),
    "max_len_b": ("--max-len-b", nonnegative_int, int, (0, 1024)),
    "alpha": (None, finite_float, float, (-10.0, 10.0)),
    "max_successors": (None, positive_int, int, (1, 100)),
}


def _parser(language_model: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_decoding_arguments(parser, language_model=language_model)
    return parser


def test_table_keeps_the_flags_and_fields():
    got = {
        name: (
            "--" + name.replace("_", "-") if o.help is not None else None,
            o.parse,
            o.kind,
            o.http_range,
        )
        for name, o in DECODING_OPTIONS.items()
    }
    assert got == INTERFACE
    flags = [a.option_strings for a in _parser()._actions if a.dest not in ("help", "lm")]
    assert flags == [[flag] for flag, *_ in INTERFACE.values() if flag is not None]
    # --gamma weighs the language model of --lm: a verb without --lm has neither
    without = [a.option_strings for a in _parser(language_model=False)._actions]
    assert without == [["-h", "--help"], *(f for f in flags if f != ["--gamma"])]
    assert [a.dest for a in _parser()._actions].index("lm") == list(INTERFACE).index("gamma") + 1


def test_command_line_reads_the_table():
    parser = _parser()
    for name, (flag, parse, kind, _) in INTERFACE.items():
        if flag is None:
            continue
        action = next(a for a in parser._actions if a.dest == name)
        assert action.type is parse and action.default is None
        assert action.help == DECODING_OPTIONS[name].help
        args = parser.parse_args([flag, "7"])
        assert getattr(args, name) == kind(7)
        bad = "1.5" if kind is int else "nan"
        with pytest.raises(argparse.ArgumentError):
            parser.parse_args([flag, bad])
    # the keywords without a flag are not taken from a namespace that happens to hold them
    args = parser.parse_args(["--beta", "2"])
    args.alpha = 3.0

    class Model:
        flag_aliases: dict = {}

    assert decoding_options(args, Model(), "lookahead") == {"beta": 2.0}


def test_python_api_reads_the_table():
    for name, (_, parse, kind, _) in INTERFACE.items():
        check_option_values({name: kind(7)})
        if kind is int:
            with pytest.raises(InputError, match=f"option {name}: expected an integer"):
                check_option_values({name: 1.5})
        if parse in (positive_int, positive_float):
            with pytest.raises(InputError, match=f"option {name}: must be > 0|must be >= 1"):
                check_option_values({name: 0})


@pytest.fixture(scope="module")
def engines(models) -> dict[str, Engine]:
    return {kind: Engine.from_directory(models[kind]) for kind in ("dat", "at")}


def test_http_fields_read_the_table(engines):
    covered = set()
    for engine in engines.values():
        for strategy, names in engine.strategies.items():
            for name in names:
                covered.add(name)
                _, _, kind, (low, high) = INTERFACE[name]
                with pytest.raises(InputError, match=rf"option '{name}' must be in \["):
                    engine.check(strategy, {name: kind(high) + 1})
                if low > 0:
                    with pytest.raises(InputError, match=rf"option '{name}' must be in \["):
                        engine.check(strategy, {name: kind(low) / 2 if kind is float else 0})
                if kind is int:
                    with pytest.raises(InputError, match=f"option '{name}' must be an integer"):
                        engine.check(strategy, {name: 1.5})
    # every HTTP field is taken by some strategy of the tiny DAT or AT model; gamma only by a
    # server with a language model (tests/test_lm_cli.py::test_serve_engine_with_lm)
    assert covered == set(INTERFACE) - {"gamma"}
    with pytest.raises(InputError, match="unknown option 'bogus'"):
        engines["dat"].check("greedy", {"bogus": 1})
