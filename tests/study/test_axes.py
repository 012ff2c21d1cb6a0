"""A study file's [axes] table: the cells (product, order, names) and each cell's run keys."""

from __future__ import annotations

import pytest
from hallulog.study.axes import axis_values, cell_keys, study_cell_values
from hallulog.study.naming import StudyError, cell_name


def test_cells_are_the_product_in_axis_order_last_axis_fastest():
    axes = {
        "seeds": [0, 1],
        "tasks": [{"task": "triviaqa"}, {"task": "nq_open", "task_path": "d/nq.jsonl"}],
        "models": ["/m/SmolLM2-135M-Instruct"],
    }
    cells = study_cell_values("s.toml", axes)
    assert [cell_name(v) for v in cells] == [
        "smollm2-135m-instruct__triviaqa__seed0",
        "smollm2-135m-instruct__triviaqa__seed1",
        "smollm2-135m-instruct__nq_open-nq__seed0",
        "smollm2-135m-instruct__nq_open-nq__seed1",
    ]
    assert list(cells[0]) == ["model", "task", "seed"]


def test_no_axes_is_one_cell():
    assert study_cell_values("s.toml", None) == [{}]
    assert cell_name({}) == "cell"


def test_cell_keys_lay_axis_tables_over_the_shared_keys_without_names():
    values = {
        "model": {"model": "/m/x", "name": "small"},
        "task": {"task": "qa", "task_path": "d.csv", "name": "mine"},
        "prompt": {"name": "terse", "system_prompt": "Be brief."},
        "seed": 3,
    }
    assert cell_keys(values) == {
        "model": "/m/x",
        "task": "qa",
        "task_path": "d.csv",
        "system_prompt": "Be brief.",
        "seed": 3,
    }


@pytest.mark.parametrize(
    ("axes", "needle"),
    [
        ({"modles": ["x"]}, "no axis 'modles'"),
        ({"models": []}, "axes.models must be a non-empty list"),
        ({"models": [3]}, "axes.models[0]: 3 is not a model"),
        ({"models": [{"model": "x", "seed": 1}]}, "not 'seed'"),
        ({"tasks": ["triviaqa"]}, "axes.tasks[0]: 'triviaqa' is not a table of task keys"),
        ({"tasks": [{"task_path": "x"}]}, "a task table needs `task`"),
        ({"prompts": [{"chat": True}, "x"]}, "axes.prompts[1]"),
        ({"seeds": [1, True]}, "axes.seeds[1]: True is not an integer seed"),
        (["models"], "[axes] must be a table"),
        (
            {"prompts": [{"name": "a", "chat": True}, {"name": "a", "chat": False}]},
            "both make the cell label 'a'",
        ),
    ],
)
def test_a_bad_axis_is_one_line_naming_the_file_and_axis(axes, needle):
    with pytest.raises(StudyError) as err:
        axis_values("study.toml", axes)
    msg = str(err.value)
    assert msg.startswith("study.toml: ") and needle in msg and "\n" not in msg
