"""Reading and running the code blocks of the README and the docs pages (not a test module).

A page's ```python and ```bash blocks run in the order they stand, in one directory: the Python
blocks in one namespace, each bash block as ``bash -euo pipefail`` there, so a block may use what
the blocks above it wrote (a bash block converts the CSV a Python block wrote). ``tsfile-torch``
and ``python`` in a bash block are this checkout's, run by the interpreter running the tests.

An HTML comment on the line before a block (invisible on GitHub and in the site) marks one that
the default run leaves out; the reason is required and shows in pytest's skip summary:

    <!-- not-tested: installs packages -->     never run by the tests
    <!-- slow-test: a benchmark, ~10 s -->     run by ``python -m pytest -m slow`` only

Any other block runs, and one that fails fails its page's test: fix it, or mark it.
"""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the marks a block may carry, by the name written in its comment
MARKS = ("not-tested", "slow-test")
#: seconds one bash block may take
BASH_TIMEOUT = 300

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", flags=re.S | re.M)
_MARK = re.compile(r"<!--\s*([\w-]+)\s*:?\s*(.*?)\s*-->\s*$")
# the command names a block uses, bound to this checkout and this interpreter
_PRELUDE = """\
tsfile-torch() { "$DOC_BLOCKS_PYTHON" -m tsfile_torch "$@"; }
python() { "$DOC_BLOCKS_PYTHON" "$@"; }
"""


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    mark: str | None  # one of MARKS, or None: runs in the default run
    reason: str

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Return the fenced ```python and ```bash blocks of ``page``, with their marks.

    Raises:
        ValueError: a mark not in ``MARKS``, a mark without a reason, a block in a language this
            runner does not know (say ```sh), or a fence it cannot pair (indented, unclosed):
            each would silently go untested.
    """
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        lang, code = match.group(1), match.group(2)
        line = text.count("\n", 0, match.start()) + 1
        if lang not in ("python", "bash"):
            raise ValueError(
                f"{page.name}:{line}: a ```{lang} block is never run; write it as ```python or "
                "```bash (marked not-tested if it cannot run here)"
            )
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark, reason = None, ""
        if comment := _MARK.match(before.strip()):
            mark, reason = comment.group(1), comment.group(2)
            if mark not in MARKS or not reason:
                raise ValueError(
                    f"{page.name}:{line}: the comment before the block must be "
                    f"'<!-- MARK: REASON -->' with MARK one of {', '.join(MARKS)}; got {before!r}"
                )
        found.append(Block(page, line, lang, code, mark, reason))
    fences = sum(line.lstrip().startswith("```") for line in text.splitlines())
    if fences != 2 * len(found):  # an indented or unclosed fence would go untested
        raise ValueError(f"{page.name}: {fences} fence lines for {len(found)} blocks read")
    return found


def run_page(page: Path, cwd: Path, *, slow: bool = False) -> dict:
    """Run the blocks of ``page`` in order in ``cwd`` (the current directory); return the Python
    namespace. ``not-tested`` blocks are left out, and ``slow-test`` ones unless ``slow``."""
    namespace: dict = {"__name__": f"docs.{page.stem}"}
    for block in blocks(page):
        if block.mark == "not-tested" or (block.mark == "slow-test" and not slow):
            continue
        if block.lang == "python":
            # blank lines in front, so a traceback names the page's own line numbers
            code = "\n" * block.line + block.code
            exec(compile(code, str(page), "exec"), namespace)
        else:
            run_bash(block, cwd)
    return namespace


def run_bash(block: Block, cwd: Path) -> subprocess.CompletedProcess:
    """Run a bash block in ``cwd``, with HOME there too (benchmarks write ~/.cache)."""
    home = cwd / ".home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "DOC_BLOCKS_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "HOME": str(home),
        "PYTHONUSERBASE": site.getuserbase(),  # packages installed with --user stay importable
    }
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _PRELUDE + block.code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=BASH_TIMEOUT,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"the bash block at {block.where} failed (exit {result.returncode}); fix it, or mark "
            f"it '<!-- not-tested: REASON -->' on the line before if it cannot run in a test\n"
            f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-4000:]}"
        )
    return result
