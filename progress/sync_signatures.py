"""Generate ``src/nightshift_progress/signatures.json`` from Nightshift's ``app/domain/diagnosis/signatures.yaml``.

    .venv/bin/python progress/sync_signatures.py          # rewrite the JSON
    .venv/bin/python progress/sync_signatures.py --check  # exit 1 when it is out of date

The progress package cannot read the YAML itself (its only dependency is prometheus-client), so it carries this
JSON copy; ``tests/unit/test_progress.py`` fails while the two differ.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = REPO_ROOT / "app" / "domain" / "diagnosis" / "signatures.yaml"
TARGET = REPO_ROOT / "progress" / "src" / "nightshift_progress" / "signatures.json"
# An error_class label signature names its class literally: pattern '^nccl$'.
_CLASS_PATTERN = re.compile(r"\^([a-z_]+)\$")


def document(catalogue: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON document for the signature entries of ``catalogue`` (the parsed YAML list)."""
    classes: dict[str, str] = {}
    for entry in catalogue:
        match = _CLASS_PATTERN.fullmatch(str(entry.get("pattern", "")))
        if entry.get("label") == "error_class" and match:
            classes[entry["category"]] = match.group(1)
    signatures = [
        {"category": e["category"], "pattern": e["pattern"], "weight": e["weight"]}
        for e in catalogue
        if "label" not in e
    ]
    return {
        "generated_from": "app/domain/diagnosis/signatures.yaml by progress/sync_signatures.py; do not edit",
        "classes": dict(sorted(classes.items())),
        "signatures": signatures,
    }


def rendered(catalogue_path: Path = CATALOGUE) -> str:
    return json.dumps(document(yaml.safe_load(catalogue_path.read_text())), indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the JSON is out of date")
    args = parser.parse_args(argv)
    text = rendered()
    if args.check:
        if TARGET.read_text() != text:
            print(f"{TARGET} is out of date: run {Path(__file__).relative_to(REPO_ROOT)}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
