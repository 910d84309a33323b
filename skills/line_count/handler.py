"""line_count: count lines of files matching a glob (runs inside the sandbox; stdlib only)."""

import json
import os
import sys
from pathlib import Path


def main() -> None:
    args = json.loads(os.environ["SKILL_ARGS"])
    root = Path.cwd()
    files = []
    for path in sorted(root.glob(args["pattern"])):
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        files.append({"path": str(path.relative_to(root)), "lines": data.count(b"\n"), "words": len(data.split()),
                      "bytes": len(data)})
    top = sorted(files, key=lambda f: f["lines"], reverse=True)[: args.get("top") or 5]
    json.dump({"files": len(files), "lines": sum(f["lines"] for f in files), "words": sum(f["words"] for f in files),
               "bytes": sum(f["bytes"] for f in files), "longest": top}, sys.stdout)


if __name__ == "__main__":
    main()
