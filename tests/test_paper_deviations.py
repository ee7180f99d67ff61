"""The paper protocol's deviation table: valid rows, a docs page generated from it, and the
lines every paper run prints at its start."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolve.spec.paper_deviations import (
    ITEMS,
    ROLES,
    kept_deviations,
    load_deviations,
    main,
    parse_deviations,
    read_deviations,
    render_markdown,
    start_lines,
)

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "paper-deviations.md"

ROW = """
[[deviation]]
id = "{id}"
status = "kept"
roles = {roles}
items = ["parsing"]
ours = "o"
reference = "r"
why = "w"
affects = "a"
"""


def test_every_row_is_valid_and_uses_the_vocabularies():
    deviations = load_deviations()
    assert len({d.id for d in deviations}) == len(deviations)
    for deviation in deviations:
        assert set(deviation.roles) <= set(ROLES)
        assert set(deviation.items) <= set(ITEMS)
    # Rows the protocol work closed, and the differences kept on purpose.
    closed = {d.id for d in deviations if d.status == "closed"}
    assert {"reflector_prompt", "agent_max_tokens", "paper_number", "simulator_temperature"} <= (
        closed
    )
    assert {"embedder", "reflector_structured_output", "feedback_cap"} <= closed
    assert {"upper_bound_parsing", "probe_template", "answer_index"} <= {
        d.id for d in kept_deviations()
    }
    assert {"paper_number_expected_value", "reflect_after_last_period", "types_braces"} <= {
        d.id for d in kept_deviations()
    }


def test_an_unknown_role_or_a_repeated_id_is_refused():
    with pytest.raises(ValueError, match="unknown role"):
        parse_deviations(ROW.format(id="x", roles='["agent"]'))
    with pytest.raises(ValueError, match="more than once"):
        parse_deviations(ROW.format(id="x", roles='["awi"]') * 2)


def test_a_table_file_is_read_with_the_same_checks(tmp_path):
    assert read_deviations(ROOT / "evolve" / "spec" / "paper_deviations.toml") == load_deviations()
    table = tmp_path / "table.toml"
    table.write_text(ROW.format(id="Not-A-Slug", roles='["awi"]'), encoding="utf-8")
    with pytest.raises(ValueError, match=r"table\.toml: deviation Not-A-Slug: id"):
        read_deviations(table)
    table.write_text("[[deviation]\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"table\.toml: not valid TOML"):
        read_deviations(table)


def test_the_committed_page_is_the_generated_one():
    assert PAGE.read_text(encoding="utf-8") == render_markdown(), (
        "docs/reference/paper-deviations.md is stale: run "
        "`python -m evolve.spec.paper_deviations --markdown > docs/reference/paper-deviations.md`"
    )


def test_the_page_lists_every_row():
    page = render_markdown()
    for deviation in load_deviations():
        assert f"`{deviation.id}`" in page


def test_start_lines_name_every_kept_row_once_and_no_closed_one(capsys):
    lines = start_lines()
    kept = kept_deviations()
    assert len(lines) == 1 + len(kept)
    for deviation in kept:
        assert sum(line.startswith(f"  {deviation.id}: ") for line in lines) == 1
    closed = [d for d in load_deviations() if d.status == "closed"]
    assert not any(line.startswith(f"  {d.id}:") for d in closed for line in lines)
    assert main([]) == 0
    assert capsys.readouterr().out.splitlines() == lines
