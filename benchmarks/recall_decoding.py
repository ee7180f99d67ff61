"""Can the agent's model read a recall world's paraphrases? Shown exactly the sentence that
revealed a fact's current value, does it pick that value?

For every (user, period, question) of a recall preset's environment, the lean prompt of
`answer_from_memory.py` is shown one memory line, the asked variable's latest revealing sentence
of its current value under the variable's label, and asked the question with its options.
What this measures is the answer step's ceiling for that world's sentences: a perfect write
and read can do no better. `--catalog-file F` replaces the built-in catalog file of F's name
(to compare a revised file with the shipped one).

    .venv/bin/python benchmarks/recall_decoding.py [--preset recall_crafts] [--seed 13]
        [--users 4] [--catalog-file path/to/crafts.json] [--model-size 1.5b]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import answer_from_memory  # noqa: E402
from answer_from_memory import ideal_entries, lean_choice  # noqa: E402

import evolve.simulator.synthesis.catalogs as catalogs  # noqa: E402
from evolve.llm.config import EmbeddedModelConfig, LLMConfig  # noqa: E402
from evolve.llm.roles import open_role_lms  # noqa: E402
from evolve.simulator.synthesis.offline import synthesize_environment  # noqa: E402
from evolve.simulator.synthesis.presets import get_preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="recall_crafts")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--catalog-file", type=Path, default=None)
    parser.add_argument("--model-size", default="1.5b")
    args = parser.parse_args()
    if args.catalog_file is not None:
        # A copy of the built-in catalog with the file replaced (the module's directory is
        # what `load_catalog` always reads, and `ideal_entries` reads the same catalog).
        copy = Path(tempfile.mkdtemp()) / "catalog"
        shutil.copytree(catalogs.CATALOG_DIR, copy)
        shutil.copy(args.catalog_file, copy / args.catalog_file.name)
        catalogs.CATALOG_DIR = copy
    answer_from_memory.load_catalog = catalogs.load_catalog
    catalog = catalogs.load_catalog()
    env = synthesize_environment(get_preset(args.preset), args.seed, args.users, catalog=catalog)
    config = LLMConfig(embedded=EmbeddedModelConfig(model_size=args.model_size, cache=False))
    per_variable: dict[str, list[int]] = {}
    with open_role_lms(config) as lms:
        lm = lms.lm("agent")
        for item in env.items:
            for period in range(len(item.periods)):
                entries = ideal_entries(item, period)
                for index, qa in enumerate(item.qas):
                    variable = qa.required_info[0]
                    label = catalog.variables[variable].label
                    shown = [entry for entry in entries if entry.label == label]
                    if not shown:  # changed and not said since: no sentence to show
                        continue
                    options = [choice.answer for choice in qa.answer_choices]
                    choice = lean_choice(lm, shown, qa.query, options)
                    tally = per_variable.setdefault(variable, [0, 0])
                    tally[0] += choice == item.gold_choice_index(period, index) + 1
                    tally[1] += 1
    right = sum(r for r, _ in per_variable.values())
    asked = sum(n for _, n in per_variable.values())
    source = args.catalog_file or "the built-in catalog"
    print(f"{args.preset} seed {args.seed}, {args.users} users, {source}: {args.model_size} picks")
    print(f"the value shown its revealing sentence {right}/{asked} = {right / max(asked, 1):.2f}")
    for variable, (r, n) in sorted(per_variable.items()):
        print(f"  {variable}: {r}/{n}")


if __name__ == "__main__":
    main()
