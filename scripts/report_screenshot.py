"""Screenshot a report page in headless Chromium, e.g. for docs/images/report.png.

    python scripts/report_screenshot.py runs/quickstart-.../report.html docs/images/report.png

The page draws its charts with JavaScript, so a plain HTML renderer would show empty boxes; Chromium
runs the scripts (``--virtual-time-budget`` lets them finish) before it takes the picture.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path


def screenshot(page: Path, out: Path, width: int, height: int, chromium: str) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
                        "--hide-scrollbars", f"--window-size={width},{height}", f"--screenshot={out.resolve()}",
                        page.resolve().as_uri()], check=True, capture_output=True, timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="a report.html (or an overlay page)")
    parser.add_argument("out", type=Path, help="PNG to write")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1800)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    if not args.page.is_file():
        print(f"error: {args.page}: no such page", file=sys.stderr)
        return 2
    screenshot(args.page, args.out, args.width, args.height, args.chromium)
    print(f"screenshot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
