"""The docs site: every block of every page runs as written (see doc_blocks); the site builds
strictly."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest
from doc_blocks import MARKS, ROOT, blocks, run_page

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
#: pages whose blocks need a service started for them; each has its own test below
NEEDS_SETUP = {"object-storage.md"}
#: pages whose blocks take seconds (workers, conversions): run with -m slow
SLOW_PAGES = {"convert.md", "orders-and-resume.md"}
#: every block the default run leaves out, README's included: each is listed with its reason
LEFT_OUT = [b for page in [ROOT / "README.md", *PAGES] for b in blocks(page) if b.mark]


@pytest.fixture
def in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the blocks write relative paths ("data/", "panel/")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # and their mkdtemp lands here
    return tmp_path


def test_every_page_is_in_the_site_navigation_and_has_a_test():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert [p.name for p in PAGES if f": {p.name}" not in nav] == []
    names = {p.name for p in PAGES}
    assert NEEDS_SETUP | SLOW_PAGES <= names  # a renamed page is not silently untested


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_PAGES else p
        for p in PAGES
        if p.name not in NEEDS_SETUP
    ],
    ids=lambda p: p.name,
)
def test_the_blocks_of_the_page_run_as_written(page, in_tmp_path):
    run_page(page, in_tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", sorted({b.page for b in LEFT_OUT if b.mark == "slow-test"}), ids=lambda p: p.name
)
def test_the_blocks_of_the_page_run_as_written_slow_ones_too(page, in_tmp_path):
    run_page(page, in_tmp_path, slow=True)


@pytest.mark.parametrize("block", LEFT_OUT, ids=lambda b: b.where)
def test_a_block_left_out_says_why(block):
    assert block.mark in MARKS and block.reason
    if block.mark == "slow-test":
        pytest.skip(f"{block.where} runs with -m slow only: {block.reason}")
    pytest.skip(f"{block.where} not run by the tests: {block.reason}")


def test_a_block_that_fails_fails_the_page_unless_marked_and_unknown_fences_are_refused(
    in_tmp_path,
):
    page = in_tmp_path / "page.md"
    page.write_text("```bash\necho ran > ran.txt\nexit 3\n```\n")
    with pytest.raises(AssertionError, match=r"bash block at page.md:1 failed \(exit 3\)"):
        run_page(page, in_tmp_path)
    assert (in_tmp_path / "ran.txt").read_text() == "ran\n"  # in the page's directory
    page.write_text("<!-- not-tested: exits 3 -->\n```bash\nexit 3\n```\n")
    run_page(page, in_tmp_path)  # left out: no error
    for text, refused in [
        ("<!-- not-tested -->\n```bash\nexit 3\n```\n", "MARK: REASON"),
        ("```sh\nexit 3\n```\n", "never run"),
        ("- a list item\n  ```bash\n  exit 3\n  ```\n", "2 fence lines for 0 blocks"),
    ]:
        page.write_text(text)
        with pytest.raises(ValueError, match=refused):
            blocks(page)


@pytest.mark.slow  # an S3 server and a fresh interpreter
def test_the_object_storage_page_runs_against_a_local_s3(
    s3_server, small_dir, in_tmp_path, monkeypatch, capsys
):
    s3_server.upload("tsfile-torch-demo", small_dir, prefix="data/")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    gets = s3_server.object_gets("tsfile-torch-demo")
    run_page(DOCS / "object-storage.md", in_tmp_path)
    assert capsys.readouterr().out == "s3://tsfile-torch-demo/data/part000.tsfile 5000 18\n"
    assert len(list((in_tmp_path / "tsfile-torch-cache").glob("*.tsfile"))) == 3
    # per file: range reads of the head and tail by the validation child and by the catalog,
    # then one download; never more than that
    assert s3_server.object_gets("tsfile-torch-demo") - gets <= 3 * (2 + 2) + 3


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    built = {p.parent.name for p in site.glob("*/index.html")}
    assert built == {p.stem for p in PAGES if p.stem != "index"}
