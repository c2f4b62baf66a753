"""Matrix expansion and validation: pure functions, no MLX."""

from __future__ import annotations

import pytest

from shared.matrix import (
    DECODE,
    PREFILL,
    Cell,
    MatrixError,
    MatrixSpec,
    count_cells,
    expand,
    group_by_model,
    parse_int_list,
)


def test_cells_are_labelled_like_llama_bench() -> None:
    assert Cell("small", 16, PREFILL, 512, 1).test == "pp512"
    assert Cell("small", 16, DECODE, 512, 1, 64).test == "tg64 @ d512"
    assert Cell("small", 4, DECODE, 128, 2, 64).name == "small/q4 tg64 @ d128 b2"
    assert Cell("small", 4, DECODE, 128, 2, 64).tokens == 128
    assert Cell("small", 4, PREFILL, 128, 2).tokens == 256


def test_expansion_is_the_cross_product_grouped_by_model() -> None:
    spec = MatrixSpec(
        seq_lengths=(32, 64),
        batch_sizes=(1, 2),
        models=("small", "full"),
        bits=(4, 16),
        decode_tokens=8,
    )
    cells = expand(spec)
    assert len(cells) == 2 * 2 * 2 * 2 * 2
    groups = group_by_model(cells)
    assert [(g.model, g.bits) for g in groups] == [
        ("small", 4),
        ("small", 16),
        ("full", 4),
        ("full", 16),
    ]
    first = [c.test for c in groups[0].cells if c.batch_size == 1]
    assert first == ["pp32", "pp64", "tg8 @ d32", "tg8 @ d64"]


def test_zero_decode_tokens_skips_decode() -> None:
    cells = expand(MatrixSpec(seq_lengths=(8,), models=("small",), decode_tokens=0))
    assert [c.mode for c in cells] == [PREFILL]


def test_default_bits_follow_the_model() -> None:
    spec = MatrixSpec(seq_lengths=(8,), models=("small", "full", "/models/x"), decode_tokens=0)
    assert [(c.model, c.bits) for c in expand(spec)] == [
        ("small", 16),
        ("full", 4),
        ("/models/x", None),
    ]


def test_duplicates_are_measured_once() -> None:
    spec = MatrixSpec(seq_lengths=(8, 8), batch_sizes=(1, 1), models=("small",), decode_tokens=0)
    assert len(expand(spec)) == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seq_lengths": (0,)}, "sequence length 0"),
        ({"seq_lengths": (1_048_577,)}, "sequence length 1048577"),
        ({"batch_sizes": (0,)}, "batch size 0"),
        ({"batch_sizes": (-2,)}, "batch size -2"),
        ({"bits": (3,)}, "bits 3"),
        ({"iterations": 0}, "iterations 0"),
        ({"warmup": -1}, "warmup -1"),
        ({"decode_tokens": -1}, "decode tokens -1"),
        ({"models": ()}, "model"),
        ({"seq_lengths": (True,)}, "sequence length True"),
    ],
)
def test_invalid_matrices_name_the_problem(change: dict, message: str) -> None:
    spec = MatrixSpec(**({"models": ("small",)} | change))
    with pytest.raises(MatrixError, match=message):
        expand(spec)


def test_round_trip_through_plain_data() -> None:
    spec = MatrixSpec(seq_lengths=(8, 16), models=("small",), bits=(4, None), decode_tokens=4)
    assert MatrixSpec.from_dict(spec.to_dict()) == spec


def test_from_dict_rejects_unknown_fields() -> None:
    with pytest.raises(MatrixError, match="unknown matrix field"):
        MatrixSpec.from_dict({"seq_lengths": [8], "turbo": True})


def test_from_dict_rejects_a_field_of_the_wrong_type() -> None:
    with pytest.raises(MatrixError, match="seq_lengths must be a list"):
        MatrixSpec.from_dict({"seq_lengths": 8})


def test_from_dict_validates_the_spec_it_builds() -> None:
    with pytest.raises(MatrixError, match="batch size"):
        MatrixSpec.from_dict({"batch_sizes": [0]})


def test_parse_int_list() -> None:
    assert parse_int_list("128, 512,1024", "-s") == (128, 512, 1024)
    with pytest.raises(MatrixError, match="-s"):
        parse_int_list("1,,2", "-s")
    with pytest.raises(MatrixError, match="not a list of integers"):
        parse_int_list("1,x", "-s")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"batch_sizes": (1_000_000,)}, "batch size 1000000 is above the limit of 1024"),
        ({"iterations": 10**9}, "iterations 1000000000 is above the limit of 1000"),
        ({"warmup": 101}, "warmup 101 is above the limit of 100"),
        ({"decode_tokens": 8193}, "decode tokens 8193 is above the limit of 8192"),
        (
            {"seq_lengths": (1_048_576,), "batch_sizes": (8,), "decode_tokens": 0},
            "would hold 8388608 tokens",
        ),
        ({"seq_lengths": tuple(range(1, 1026))}, "1025 sequence lengths given; at most 1024"),
        ({"seq_lengths": tuple(range(1, 600))}, "1198 cells; the limit is 1024 per job"),
        ({"models": ("/m/" + "x" * 5000,)}, "5003 characters; the limit is 1024"),
        ({"models": ("/m/a\x00b",)}, "NUL"),
        ({"bits": (4.0,)}, "bits 4.0 not supported"),
    ],
)
def test_a_matrix_beyond_a_limit_names_the_limit(change: dict, message: str) -> None:
    with pytest.raises(MatrixError, match=message):
        expand(MatrixSpec(**({"models": ("small",)} | change)))


def test_the_largest_matrix_within_the_limits_runs() -> None:
    spec = MatrixSpec(seq_lengths=tuple(range(1, 513)), models=("small",), decode_tokens=4)
    assert len(expand(spec)) == 1024


def test_count_cells_is_the_expansion_without_building_it() -> None:
    spec = MatrixSpec(
        seq_lengths=(8, 8, 16),
        batch_sizes=(1, 2),
        models=("small", "full", "small", "/models/x"),
        bits=(None, 4, 16),
        decode_tokens=2,
    )
    assert count_cells(spec) == len(expand(spec))
