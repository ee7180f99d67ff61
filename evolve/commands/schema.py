"""`evolve schema [KIND] [--out DIR]`: the JSON schema of a spec file, for editors and docs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evolve.commands.spec_schema import SPEC_SCHEMAS, schema_text, write_spec_schemas
from evolve.core.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "schema",
        help="print the JSON schema of a spec file (experiment, tuning, arms, synthesis)",
        description="Print the JSON schema of one kind of spec file, generated from the "
        "models that validate it, or write every kind to --out DIR as <kind>.json. Editors "
        "that read a `#:schema PATH` first line (taplo, Even Better TOML) then complete and "
        "check the spec.",
    )
    parser.add_argument(
        "kind",
        nargs="?",
        help=f"one of {', '.join(SPEC_SCHEMAS)} (required without --out)",
    )
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="write every schema into DIR as <kind>.json"
    )
    parser.set_defaults(handler=run_schema)


def run_schema(args: argparse.Namespace) -> int:
    if args.kind is not None and args.kind not in SPEC_SCHEMAS:
        raise ConfigError(
            f"unknown spec kind {args.kind!r}; expected one of {', '.join(SPEC_SCHEMAS)}"
        )
    if args.out is not None:
        if args.kind is not None:
            raise ConfigError(
                f"--out writes every kind; got the kind {args.kind!r} too: drop it, or drop "
                "--out to print that one schema"
            )
        for path in write_spec_schemas(args.out):
            print(f"wrote {path}")
        return 0
    if args.kind is None:
        raise ConfigError(
            f"name the spec kind to print ({', '.join(SPEC_SCHEMAS)}), or pass --out DIR to "
            "write them all"
        )
    sys.stdout.write(schema_text(args.kind))
    return 0
