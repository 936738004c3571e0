"""The ``ddplug`` console script: runs the ``ddplug`` command (a C program).

The wheel bundles the command as ``ddplug/_lib/bin/ddplug``, with an RPATH
to the library beside it; this replaces the Python process with it
(``os.execv``), so arguments, exit status and signals are the command's own.
From a source checkout (``hosts/python`` on ``sys.path``) the build tree's
``$DDPLUG_BUILD_DIR/bin/ddplug`` serves instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Sequence


def command_path() -> Optional[str]:
    """Where the ``ddplug`` program is: the wheel's, else the build tree's."""
    bundled = Path(__file__).resolve().parents[1] / "_lib" / "bin" / "ddplug"
    if bundled.is_file():
        return str(bundled)
    build = os.environ.get("DDPLUG_BUILD_DIR")
    if build and (Path(build) / "bin" / "ddplug").is_file():
        return str(Path(build) / "bin" / "ddplug")
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    prog = command_path()
    if prog is None:
        sys.stderr.write(
            "ddplug: the ddplug command is not bundled with this package (looked for"
            f" {Path(__file__).resolve().parents[1] / '_lib' / 'bin' / 'ddplug'}): install the"
            " wheel (pip install . from the repository root), or set DDPLUG_BUILD_DIR to"
            " a build directory holding bin/ddplug\n"
        )
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(prog, [prog] + args)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
