"""The documentation site: `tools/build_docs.py` builds it strict from the repository's pages (a broken link
or an API name that no longer exists fails the build), and a real headless browser opens the home page, a
rendered notebook with its figure, and an API page."""

from __future__ import annotations

import pytest

from tests.browser import serve

pytest.importorskip("mkdocs", reason="the docs extra is not installed: make venv installs it from the lock")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from tools.build_docs import build

    root = tmp_path_factory.mktemp("docs")
    build(root / "site", root / "source")
    return root / "site"


def test_the_site_has_every_page(site):
    from helpers.paths import NOTEBOOKS_DIR
    from tools.build_docs import API_MODULES

    for stem in sorted(p.stem for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")):
        assert (site / "notebooks" / stem / "index.html").is_file(), f"{stem} is not rendered"
    for module in API_MODULES:
        page = (site / "reference" / module / "index.html").read_text()
        assert f'id="{module}' in page, f"the API page of {module} documents nothing"
    for page in ("getting-started", "own-code", "scaling-up", "cluster", "tracking", "troubleshooting",
                 "limitations", "glossary", "testing", "reference-check", "benchmarks", "gpu", "environment"):
        assert (site / page / "index.html").is_file(), page


def test_a_broken_link_fails_the_build(tmp_path):
    from tools import build_docs

    source = tmp_path / "source"
    build_docs.assemble(source)
    (source / "troubleshooting.md").write_text("# Troubleshooting\n\nSee [the launcher](no-such-page.md).\n")
    with pytest.raises(SystemExit, match="(?s)strict.*no-such-page.md"):
        build_docs.build(tmp_path / "site", source, assembled=True)


def test_links_follow_the_pages_into_the_site():
    from tools.build_docs import ROOT, rewrite_links

    readme, doc = ROOT / "README.md", ROOT / "docs" / "launcher.md"
    assert rewrite_links("[x](docs/launcher.md#options)", readme, "index.md") == "[x](launcher.md#options)"
    assert rewrite_links("[07](../notebooks/07_trl_sft_gpt_oss.ipynb#Scaling-up)", doc, "launcher.md") == \
        "[07](notebooks/07_trl_sft_gpt_oss.ipynb#Scaling-up)"
    assert rewrite_links("[data](../data/README.md)", doc, "launcher.md") == "[data](data.md)"
    # a file that is not a page: its path, in code type
    assert rewrite_links("[`benchmarks/ray_start.py`](../benchmarks/ray_start.py)", doc, "launcher.md") == \
        "`benchmarks/ray_start.py`"
    assert rewrite_links("[the options](../helpers/launch/options.py)", doc, "launcher.md") == \
        "the options (`helpers/launch/options.py`)"
    assert rewrite_links("[uv](https://docs.astral.sh/uv/)", readme, "index.md") == "[uv](https://docs.astral.sh/uv/)"


def test_the_site_in_a_headless_browser(site, browser):
    with serve(site) as base:
        assert browser.load(base + "index.html") == []
        assert browser.evaluate("document.title").startswith("distributed-gallery")
        nav = browser.evaluate("[...document.querySelectorAll('nav a')].map(a => a.innerText)")
        assert any("The gallery" in n or "01 DDP MLP" in n for n in nav), nav

        assert browser.load(base + "notebooks/01_ddp_mlp/") == []
        images = browser.evaluate("[...document.images].filter(i => i.src.startsWith('data:image/png'))"
                                  ".map(i => i.complete && i.naturalWidth > 100)")
        assert images and all(images), "the notebook's figures are not shown"
        text = browser.evaluate("document.body.innerText")
        assert "DistributedDataParallel" in text and "all checks passed" in text

        assert browser.load(base + "reference/helpers.launch/") == []
        text = browser.evaluate("document.body.innerText")
        assert "LaunchOptions" in text and "max_restarts" in text
