"""Matrix expansion and validation: pure functions, no MLX."""

from __future__ import annotations

import random

import pytest

from shared.benchmark.matrix import (
    DECODE,
    PREFILL,
    PREFILL_DECODE,
    Cell,
    MatrixError,
    MatrixSpec,
    ModelId,
    count_cells,
    expand,
    group_by_model,
    hf_model_id,
    model_label,
    model_names,
    named_label,
    parse_int_list,
    parse_pair,
    planned_cells,
)
from shared.benchmark.results import not_run
from shared.reports.benchmark import record_model_label


def test_cells_are_labelled_like_llama_bench() -> None:
    assert Cell("small", 16, 512, 0, 0, 1).test == "pp512"
    assert Cell("small", 16, 0, 128, 0, 1).test == "tg128"
    assert Cell("small", 16, 512, 128, 0, 1).test == "pp512+tg128"
    assert Cell("small", 16, 0, 64, 512, 1).test == "tg64 @ d512"
    assert Cell("small", 16, 512, 0, 4096, 1).test == "pp512 @ d4096"
    assert Cell("small", 4, 0, 64, 128, 2).name == "small/q4 tg64 @ d128 b2"
    assert [Cell("s", 4, p, g, 0, 1).mode for p, g in ((8, 0), (0, 8), (8, 8))] == [
        PREFILL,
        DECODE,
        PREFILL_DECODE,
    ]


def test_tokens_count_prompt_and_generation_as_llama_bench_does() -> None:
    assert Cell("small", 4, 0, 64, 128, 2).tokens == 128
    assert Cell("small", 4, 128, 0, 0, 2).tokens == 256
    assert Cell("small", 4, 128, 32, 64, 1).tokens == 160
    assert Cell("small", 4, 128, 32, 64, 2).held_tokens == 448


def test_expansion_is_llama_benchs_cross_product_grouped_by_model() -> None:
    spec = MatrixSpec(
        n_prompt=(32, 64),
        n_gen=(8,),
        n_pg=((32, 8),),
        n_depth=(0, 16),
        batch_sizes=(1, 2),
        models=("small", "full"),
        bits=(4, 16),
    )
    cells = expand(spec)
    assert len(cells) == 2 * 2 * 2 * 2 * 4
    groups = group_by_model(cells)
    assert [(g.model, g.bits) for g in groups] == [
        ("small", 4),
        ("small", 16),
        ("full", 4),
        ("full", 16),
    ]
    first = [c.test for c in groups[0].cells if c.batch_size == 1]
    assert first == [
        "pp32",
        "pp64",
        "tg8",
        "pp32+tg8",
        "pp32 @ d16",
        "pp64 @ d16",
        "tg8 @ d16",
        "pp32+tg8 @ d16",
    ]


def test_a_zero_asks_for_no_test_as_in_llama_bench() -> None:
    cells = expand(MatrixSpec(n_prompt=(8,), n_gen=(0,), models=("small",)))
    assert [c.mode for c in cells] == [PREFILL]
    cells = expand(MatrixSpec(n_prompt=(0,), n_gen=(4,), models=("small",)))
    assert [c.test for c in cells] == ["tg4"]


def test_nothing_to_measure_is_refused() -> None:
    with pytest.raises(MatrixError, match="nothing to measure"):
        expand(MatrixSpec(n_prompt=(0,), n_gen=(0,), models=("small",)))


def test_default_bits_follow_the_model() -> None:
    spec = MatrixSpec(n_prompt=(8,), n_gen=(), models=("small", "full", "/models/x"))
    assert [(c.model, c.bits) for c in expand(spec)] == [
        ("small", 16),
        ("full", 4),
        ("/models/x", None),
    ]


def test_the_defaults_are_llama_benchs() -> None:
    assert [c.test for c in expand(MatrixSpec(models=("small",)))] == ["pp512", "tg128"]
    assert MatrixSpec().prefill_step_size == 2048 and MatrixSpec().iterations == 5


def test_duplicates_are_measured_once() -> None:
    spec = MatrixSpec(
        n_prompt=(8, 8), n_gen=(), n_depth=(0, 0), batch_sizes=(1, 1), models=("small",)
    )
    assert len(expand(spec)) == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_prompt": (-1,)}, "n_prompt[0]: prompt length -1 must be 0 or more"),
        ({"n_prompt": (8, 1_048_577)}, "n_prompt[1]: prompt length 1048577 is above"),
        ({"n_gen": (-1,)}, "n_gen[0]: generation length -1 must be 0 or more"),
        ({"n_depth": (0, -3)}, "n_depth[1]: depth -3 must be 0 or more"),
        ({"n_depth": ()}, "n_depth: empty; at least one depth is needed"),
        ({"n_pg": ((0, 8),)}, "n_pg[0][0]: prompt length 0 must be at least 1"),
        ({"n_pg": ((8, 2), (8, 0))}, "n_pg[1][1]: generation length 0 must be at least 1"),
        ({"batch_sizes": (0,)}, "batch_sizes[0]: batch size 0 must be at least 1"),
        ({"batch_sizes": (1, -2)}, "batch_sizes[1]: batch size -2"),
        (
            {"bits": (4, 3)},
            "bits[1]: 3 is not supported; choose from 4, 8, 16 (or none given: the model's own)",
        ),
        ({"iterations": 0}, "iterations: 0 must be at least 1"),
        ({"warmup": -1}, "warmup: -1 must be 0 or more"),
        ({"warmup": 1.5}, "warmup: 1.5 is not an integer"),
        ({"prefill_step_size": 0}, "prefill_step_size: 0 must be at least 1"),
        ({"delay_s": -1.0}, "delay_s: -1 s is outside"),
        ({"delay_s": float("nan")}, "delay_s: nan is not a number of seconds"),
        ({"models": ()}, "models: empty; at least one model is needed"),
        ({"models": ("small", "")}, "models[1]: model '' must be"),
        ({"n_prompt": (True,)}, "n_prompt[0]: prompt length True is not an integer"),
        ({"n_prompt": (0,), "n_gen": (0,)}, "n_prompt, n_gen, n_pg: nothing to measure"),
    ],
)
def test_invalid_matrices_name_the_problem(change: dict, message: str) -> None:
    """Each message starts with the wire field it is about (docs/protocol.md §5, The matrix),
    the entry's index included, then says in words what is wrong."""
    spec = MatrixSpec(**({"models": ("small",)} | change))
    with pytest.raises(MatrixError) as refused:
        expand(spec)
    assert str(refused.value).startswith(message), str(refused.value)


def test_round_trip_through_plain_data() -> None:
    spec = MatrixSpec(
        n_prompt=(8, 16),
        n_gen=(4,),
        n_pg=((8, 2),),
        n_depth=(0, 8),
        models=("small",),
        bits=(4, None),
        delay_s=1.5,
        prefill_step_size=64,
    )
    data = spec.to_dict()
    assert data["n_pg"] == [[8, 2]]
    assert MatrixSpec.from_dict(data) == spec


def test_from_dict_rejects_unknown_fields() -> None:
    with pytest.raises(MatrixError, match="unknown matrix field"):
        MatrixSpec.from_dict({"n_prompt": [8], "turbo": True})


def test_from_dict_rejects_a_field_of_the_wrong_type() -> None:
    with pytest.raises(MatrixError, match=r"^n_prompt: 8 is not a list$"):
        MatrixSpec.from_dict({"n_prompt": 8})
    with pytest.raises(
        MatrixError, match=r"^n_pg\[1\]: \[8, 2, 1\] is not a \[prompt, generated\]"
    ):
        MatrixSpec.from_dict({"n_pg": [[8, 2], [8, 2, 1]]})


def test_from_dict_validates_the_spec_it_builds() -> None:
    with pytest.raises(MatrixError, match=r"^batch_sizes\[0\]: batch size 0"):
        MatrixSpec.from_dict({"batch_sizes": [0]})


def test_parse_int_list() -> None:
    assert parse_int_list("128, 512,1024", "-s") == (128, 512, 1024)
    with pytest.raises(MatrixError, match="-s"):
        parse_int_list("1,,2", "-s")
    with pytest.raises(MatrixError, match="not a list of integers"):
        parse_int_list("1,x", "-s")


def test_parse_pair() -> None:
    assert parse_pair("512,128", "-pg") == (512, 128)
    with pytest.raises(MatrixError, match="-pg: expected PROMPT,GENERATED"):
        parse_pair("512", "-pg")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"batch_sizes": (1_000_000,)},
            "batch_sizes[0]: batch size 1000000 is above the limit of 1024",
        ),
        ({"iterations": 10**9}, "iterations: 1000000000 is above the limit of 1000"),
        ({"warmup": 101}, "warmup: 101 is above the limit of 100"),
        ({"n_gen": (8, 8193)}, "n_gen[1]: generation length 8193 is above the limit of 8192"),
        ({"delay_s": 4000.0}, "delay_s: 4000 s is outside 0..3600 s"),
        (
            {"n_prompt": (1_048_576,), "batch_sizes": (8,), "n_gen": ()},
            "batch_sizes, n_depth, n_prompt, n_gen, n_pg: a cell would hold 8388608 tokens "
            "(batch 8 x (depth 0 + prompt 1048576 + generated 0))",
        ),
        (
            {"n_prompt": (8,), "n_depth": (1_048_576,), "batch_sizes": (4,)},
            "batch_sizes, n_depth, n_prompt, n_gen, n_pg: a cell would hold 4194816 tokens",
        ),
        ({"n_prompt": tuple(range(1, 1026))}, "n_prompt: 1025 prompt lengths given; at most 1024"),
        (
            {"n_prompt": tuple(range(1, 600)), "n_depth": (0, 1)},
            "models, bits, batch_sizes, n_depth, n_prompt, n_gen, n_pg: the matrix has 1200 "
            "cells; the limit is 1024",
        ),
        ({"models": ("/m/" + "x" * 5000,)}, "models[0]: model '/m/xxx"),
        ({"models": ("/m/a\x00b",)}, "models[0]: model '/m/a\\x00b' has a NUL character"),
        ({"bits": (4.0,)}, "bits[0]: 4.0 is not supported"),
    ],
)
def test_a_matrix_beyond_a_limit_names_the_limit(change: dict, message: str) -> None:
    with pytest.raises(MatrixError) as refused:
        expand(MatrixSpec(**({"models": ("small",)} | change)))
    assert str(refused.value).startswith(message), str(refused.value)
    if "models" in change and "x" * 10 in change["models"][0]:
        assert "5003 characters; the limit is 1024" in str(refused.value)


def test_the_largest_matrix_within_the_limits_runs() -> None:
    spec = MatrixSpec(n_prompt=tuple(range(1, 512)), n_gen=(4,), models=("small",), n_depth=(0, 8))
    assert len(expand(spec)) == 1024


def test_count_cells_is_the_expansion_without_building_it() -> None:
    spec = MatrixSpec(
        n_prompt=(8, 8, 16),
        n_gen=(2, 0),
        n_pg=((8, 2), (8, 2)),
        n_depth=(0, 4),
        batch_sizes=(1, 2),
        models=("small", "full", "small", "/models/x"),
        bits=(None, 4, 16),
    )
    assert count_cells(spec) == len(expand(spec))


def test_hugging_face_ids_are_told_from_paths_and_configs() -> None:
    assert hf_model_id("mlx-community/Llama-3.2-1B-Instruct-4bit") == ModelId(
        "mlx-community/Llama-3.2-1B-Instruct-4bit"
    )
    assert hf_model_id("org/name@v1.0") == ModelId("org/name", "v1.0")
    for not_an_id in ("small", "/models/x", "./x/y", "~/x/y", "a/b/c", "org/"):
        assert hf_model_id(not_an_id) is None, not_an_id
    assert model_label("org/name@main", 4) == "org/name@main/q4"
    assert model_label("/models/Llama-3.2-3B", 16) == "Llama-3.2-3B/f16"


def test_a_spec_stored_by_protocol_3_lists_the_cells_it_planned() -> None:
    legacy = {"seq_lengths": [32, 64], "decode_tokens": 16, "models": ["small"]}
    assert [c.name for c in planned_cells(legacy)] == [
        "small/f16 pp32 b1",
        "small/f16 pp64 b1",
        "small/f16 tg16 @ d32 b1",
        "small/f16 tg16 @ d64 b1",
    ]
    current = MatrixSpec(n_prompt=(8,), n_gen=(2,), models=("small",)).to_dict()
    assert planned_cells(current) == expand(MatrixSpec.from_dict(current))


def test_same_named_model_directories_get_labels_unique_within_the_matrix() -> None:
    """As an editor names same-named tabs: folders that clash take parent folders until none
    does; a name that clashes with nothing stays the folder's alone."""
    spec = MatrixSpec(
        n_prompt=(8,),
        n_gen=(),
        models=("/x/a/mlx", "/y/b/mlx", "/m/Llama", "/p/q/mlx", "/r/q/mlx", "/m/small", "small"),
    )
    names = [cell.name for cell in expand(spec)]
    assert names == [
        "a/mlx/stored pp8 b1",
        "b/mlx/stored pp8 b1",
        "Llama/stored pp8 b1",
        "p/q/mlx/stored pp8 b1",
        "r/q/mlx/stored pp8 b1",
        "m/small/stored pp8 b1",
        "small/f16 pp8 b1",
    ]
    assert [g.label for g in group_by_model(expand(spec))] == [n.split(" ")[0] for n in names]
    assert "label" not in expand(spec)[0].to_dict()  # a record names it only in its name
    assert model_names(["/m/a/", "/m/a"]) == {"/m/a/": "/m/a/", "/m/a": "/m/a"}
    assert model_names(["/q/org/n", "org/n"]) == {"/q/org/n": "n", "org/n": "org/n"}
    assert model_names(["/x/org/n", "/y/org/n", "org/n"])["/x/org/n"] == "x/org/n"


def test_model_names_are_unique_for_any_models() -> None:
    rng = random.Random(24)
    parts = ["a", "b", "mlx", "small", "org", "n"]
    for _ in range(500):
        models = [
            rng.choice(["", "/", "./", "~/"])
            + "/".join(rng.choice(parts) for _ in range(rng.randint(1, 4)))
            + rng.choice(["", "/"])
            for _ in range(rng.randint(1, 8))
        ] + rng.sample(["small", "full", "org/n", "org/n@main"], 2)
        names = model_names(models)
        assert len(set(names.values())) == len(names), models


def test_a_report_labels_each_cell_as_its_name_does() -> None:
    spec = MatrixSpec(n_prompt=(8,), n_gen=(), models=("/x/a/mlx", "/y/b/mlx"), bits=(None, 4))
    records = not_run(expand(spec), "never received")
    assert [record_model_label(r) for r in records] == [
        "a/mlx/stored",
        "a/mlx/q4",
        "b/mlx/stored",
        "b/mlx/q4",
    ]
    stored_before = {"model": "/x/a/mlx", "bits": None, "test": "pp8", "batch_size": 1}
    stored_before["name"] = "mlx/stored pp8 b1"  # named before labels were unique
    assert named_label(stored_before) == record_model_label(stored_before) == "mlx/stored"
    assert record_model_label({"model": "/x/a/mlx", "bits": 4}) == "mlx/q4"
    (hf_record,) = not_run(expand(MatrixSpec(n_gen=(), models=("org/n",))), "x")
    resolved = hf_record | {"model_revision": "0123456789"}
    assert record_model_label(resolved) == "org/n@0123456/stored"
