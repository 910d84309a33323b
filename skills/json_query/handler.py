"""json_query: the value at a dotted path in a JSON file (runs inside the sandbox; stdlib only)."""

import json
import os
import sys
from pathlib import Path


def main() -> None:
    args = json.loads(os.environ["SKILL_ARGS"])
    path = Path(args["path"])
    if path.is_absolute() or ".." in path.parts:
        sys.exit(f"path must be relative to the workspace: {args['path']}")
    if path.stat().st_size > 5 * 1024 * 1024:
        sys.exit(f"{path} is larger than 5 MB")
    value = json.loads(path.read_text(encoding="utf-8"))
    walked = []
    for part in [p for p in (args.get("query") or "").split(".") if p]:
        walked.append(part)
        if isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            sys.exit(f"no {'.'.join(walked)!r} in {path}")
    json.dump({"query": args.get("query") or "", "value": value}, sys.stdout)


if __name__ == "__main__":
    main()
