"""Does the simulated user stay a user? Its follow-up prompt replayed on recorded exchanges.

`records/follow_up_echoes/exchanges.json` holds the first exchange (the user's opening message
and the assistant's reply) of each session of the quickstart's world on seeds 13 and 14, as the
bundled 1.5B played them, with the follow-up the earlier prompt wrote. For each exchange this
script rebuilds the session's state-aware user view, asks the current follow-up prompt once
(no echo retry) and counts, as the conversation-health report does:

- `copies`: follow-ups that copy the assistant's reply or the user's own message
  near-verbatim (`conversation_health.echo_of`);
- `repeats`: follow-ups most of whose words are the reply's (`in_context_quotes.repeats`, the
  memory write's echo filter): softer copying, such as an "I'll try X, Y and Z" that
  restates the advice.

The same counts are printed for the recorded follow-ups (the earlier prompt, after its
retry). It starts llama-server with the quickstart's LLM setup.

    .venv/bin/python benchmarks/follow_up_echoes.py [--model-size 1.5b]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from evolve import api
from evolve.core.seeds import derive_seed
from evolve.llm import open_role_lms
from evolve.simulator.conversation_health import echo_of
from evolve.simulator.user import SimulatedUser, user_view_for
from evolve.spec.config import resolve
from memory_policies.in_context_quotes import repeats

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "records" / "follow_up_echoes" / "exchanges.json"


def counts(follow_ups: list[tuple[str, str, str]]) -> str:
    """'copies a/n, repeats b/n' over (user message, reply, follow-up) triples."""
    copies = sum(bool(echo_of(f, last_assistant=r, last_user=u)) for u, r, f in follow_ups)
    restated = sum(repeats(f, r) for _, r, f in follow_ups)
    total = len(follow_ups)
    return f"copies {copies}/{total}, repeats {restated}/{total}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "experiments" / "quickstart.toml")
    parser.add_argument("--model-size", choices=["0.5b", "1.5b"], default=None)
    parser.add_argument("--show", action="store_true", help="print every new follow-up")
    args = parser.parse_args()
    spec = api.load_spec(args.spec)
    if args.model_size:
        embedded = spec.llm.embedded.model_copy(update={"model_size": args.model_size})
        spec = spec.model_copy(update={"llm": spec.llm.model_copy(update={"embedded": embedded})})
    exchanges = json.loads(RECORD.read_text())["exchanges"]
    environments = {}
    for seed in sorted({e["seed"] for e in exchanges}):
        seeded = spec.model_copy(
            update={"environment": spec.environment.model_copy(update={"seed": seed})}
        )
        environments[seed] = resolve(seeded).environment
    recorded = [
        (e["user_message"], e["assistant_reply"], e["recorded_follow_up"])
        for e in exchanges
        if e["recorded_follow_up"]
    ]
    print(f"{len(exchanges)} recorded exchanges; earlier prompt (recorded): {counts(recorded)}")
    user = SimulatedUser()
    new: list[tuple[str, str, str]] = []
    started = time.perf_counter()
    with open_role_lms(spec.llm) as lms, lms.context("simulator"):
        for index, exchange in enumerate(exchanges):
            item = environments[exchange["seed"]].items[exchange["user"]]
            period = item.periods[exchange["period"]]
            session = period.sessions[exchange["session"]]
            view = user_view_for("state_aware", item, period, session)
            reply = exchange["assistant_reply"]
            follow_up = view.next_message(
                user,
                opening=exchange["user_message"],
                last_user=exchange["user_message"],
                last_assistant=reply,
                seed=derive_seed(spec.seed, "follow-up-echoes", index),
            )
            new.append((exchange["user_message"], reply, follow_up))
            if args.show:
                print(f"  {follow_up}", flush=True)
    seconds = time.perf_counter() - started
    print(
        f"current prompt ({spec.llm.embedded.model_size}): {counts(new)} "
        f"({seconds / len(exchanges):.1f} s a follow-up)"
    )


if __name__ == "__main__":
    main()
