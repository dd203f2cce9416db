"""Build the documentation site (`make docs`): the README as its home page, docs/, data/README.md, every
stored notebook rendered with its outputs, and an API reference from the docstrings, into site/ with MkDocs
Material.

The pages stay where a reader of the repository finds them (README.md, docs/*.md, notebooks/*.ipynb), with
links that work there; this script assembles them into one source folder (build/docs-src/, git-ignored),
rewriting those links to the site's layout, and runs `mkdocs build --strict`: a broken link, a missing page
or an API name that no longer exists fails the build. A link to a file that is not a page (a script, a JSON
file) becomes its path in code type. The gallery's command line is documented by its own `--help`, captured
here.

    python tools/build_docs.py                 # build/docs-src/ and site/
    python tools/build_docs.py --site /tmp/s   # elsewhere (the tests)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "build" / "docs-src"
# The API reference: one page per public module, with what it documents (mkdocstrings' `:::` directive)
API_MODULES = {
    "helpers": "The package's public names (the launcher, the worker context, metrics, progress bars)",
    "helpers.launch": "The launcher: `distributed`, `launch`, the options, the plan and the errors",
    "helpers.context": "What a rank knows about itself",
    "helpers.shared_storage": "Paths every rank must see (the `shared` launch option)",
    "helpers.progress": "Rank 0's progress bar, drawn in the launching notebook",
    "helpers.metrics": "`record_metrics`: a notebook's headline results",
    "helpers.registry": "Log a trained model to MLflow, register it, load it back",
    "helpers.tracking": "Where MLflow runs go, and tracking on or off",
    "helpers.settings": "The settings check every lesson makes first",
    "helpers.parameters": "A notebook's parameters as the run set them",
    "helpers.step_harness": "The harness around a hand-written training loop",
    "helpers.precision": "The `precision` parameter",
    "helpers.step_cap": "The `max_steps` parameter",
    "helpers.memory_plan": "Model state per GPU for DDP, FSDP and ZeRO, full or LoRA",
    "helpers.reference": "A notebook's results against its reference runs",
    "helpers.integrations.transformers": "transformers and TRL: progress, evaluation over the ranks, saving",
    "helpers.integrations.sft_eval": "The fine-tuning lessons' held-out evaluation, in the ranks",
    "helpers.integrations.lightning": "Lightning: progress bars from rank 0, the fit record, quiet logs",
    "helpers.integrations.streaming": "MosaicML Streaming in the ranks: shared memory, locks, clean-up",
    "helpers.retrieval_metrics": "Recall, NDCG and hit rate of a recommender, over the ranks",
    "helpers.data": "The offline data sets",
}
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def site_path(repo_path: Path) -> str | None:
    """Where a repository file lives in the site's source, or None when it is not a page."""
    rel = repo_path.relative_to(ROOT).as_posix() if repo_path.is_relative_to(ROOT) else None
    if rel is None:
        return None
    if rel == "README.md":
        return "index.md"
    if rel == "data/README.md":
        return "data.md"
    if re.fullmatch(r"docs/[^/]+\.(md|png|svg)", rel):
        return rel[len("docs/"):]
    if re.fullmatch(r"notebooks/\d\d_[^/]+\.ipynb", rel):
        return rel
    return None


def rewrite_links(text: str, source: Path, target: str) -> str:
    """Links of `source` (a repository file) as seen from `target` (its place in the site's source)."""
    target_dir = Path(target).parent

    def fix(match: re.Match) -> str:
        bang, label, href = match.groups()
        if re.match(r"^[a-z]+:", href) or href.startswith("#"):
            return match.group(0)
        path, _, fragment = href.partition("#")
        resolved = (source.parent / path).resolve()
        page = site_path(resolved)
        if page is None:   # a script, a data file, a folder: its path, to find in the repository
            shown = resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else path
            return f"`{shown}`" if label.strip("`") in (shown, path, "") else f"{label} (`{shown}`)"
        new = os.path.relpath(page, target_dir or ".")
        return f"{bang}[{label}]({new}{'#' + fragment if fragment else ''})"

    return LINK.sub(fix, text)


def notebook_for_site(source: Path, target: str) -> str:
    """The stored notebook with its markdown links rewritten for the site (outputs kept as stored)."""
    nb = json.loads(source.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            # mkdocs-jupyter makes notebooks/<stem>.ipynb the page notebooks/<stem>/: a link leaves from there
            fixed = rewrite_links(text, source, target)
            fixed = re.sub(r"\]\((?:\.\./)?(notebooks/)?(\d\d_[\w]+)\.ipynb", r"](../\2/", fixed)
            fixed = re.sub(r"\]\(\.\./(?!\d\d_)([\w-]+)\.md", r"](../../\1/", fixed)
            cell["source"] = fixed
    return json.dumps(nb)


def api_pages(dest: Path) -> list[str]:
    pages = []
    for module, title in API_MODULES.items():
        name = f"reference/{module}.md"
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(f"# `{module}`\n\n{title}.\n\n::: {module}\n")
        pages.append(name)
    usage = subprocess.run([sys.executable, "-m", "helpers.gallery", "--help"], capture_output=True,
                           text=True, cwd=ROOT, check=True).stdout
    (dest / "reference/gallery-cli.md").write_text(
        "# The gallery's command line: `python -m helpers.gallery`\n\n`make run` calls it; its `--help`:\n\n"
        f"```text\n{usage}```\n")
    return pages


def assemble(dest: Path = SOURCE) -> None:
    """Copy and rewrite every page into `dest` (emptied first)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    sources = [ROOT / "README.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for source in sources:
        target = site_path(source)
        (dest / target).write_text(rewrite_links(source.read_text(), source, target))
    for image in [*sorted((ROOT / "docs").glob("*.png")), *sorted((ROOT / "docs").glob("*.svg"))]:
        shutil.copy(image, dest / image.name)
    (dest / "notebooks").mkdir()
    for source in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        target = site_path(source)
        (dest / target).write_text(notebook_for_site(source, target))
    api_pages(dest)


def build(site: Path, source: Path = SOURCE, assembled: bool = False) -> None:
    """Assemble the pages into `source` (unless `assembled`) and build the site into `site`, strict."""
    if not assembled:
        assemble(source)
    # not --quiet: it hides the warnings that --strict counts, and a broken link would pass
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
               "--site-dir", str(site)]
    env = dict(os.environ, DOCS_SOURCE=str(source), NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", type=Path, default=ROOT / "site", help="where the site goes (site/)")
    parser.add_argument("--source", type=Path, default=SOURCE, help="where the assembled pages go")
    args = parser.parse_args(argv)
    build(args.site.resolve(), args.source.resolve())
    print(f"built the site into {args.site}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
