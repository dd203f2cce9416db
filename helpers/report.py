"""The gallery run's HTML report, and the comparison of two runs.

    python -m helpers.report runs/<stamp>                       # (re)build the report of a run folder
    python -m helpers.report --compare runs/<A> runs/<B>        # which metrics moved; exit 1 on a regression
    python -m helpers.report --compare baseline.json runs/<B> --tolerance 0.02 --tolerance test_accuracy=0.005

A run folder (written by `python -m helpers.gallery`) holds `summary.json`, the executed notebooks in
`notebooks/`, and, after `build_report`: each notebook rendered to HTML next to it, `figures/<notebook>.png`
(the main figure) and `index.html`, one row per notebook. The pages are self-contained: no script or
style is fetched from the internet (the report must open on an offline machine and in CI artifacts), so
markdown math shows as TeX source.

Thumbnails: `record_metrics(figure=...)` saves the figure the notebook's author chose as its main one
into the run folder (the last image of a notebook is often a detail, not the headline plot). For a
notebook that failed before `record_metrics`, or passed no figure, the last PNG output is used instead.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import html
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

# ---------------------------------------------------------------------------------------------------
# Rendering

_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_css -%}<link rel="icon" href="data:,">{%- endblock html_head_css -%}
"""
_REMOTE = re.compile(r"<script[^>]*\ssrc=[\"']https?://[^>]*>\s*</script>|<link[^>]*href=[\"']https?://[^>]*>",
                     re.IGNORECASE)


def render_html(ipynb: str | Path, html_path: str | Path) -> Path:
    """Render an executed notebook to a self-contained HTML page (nbconvert's lab template, no CDN)."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(extra_loaders=[DictLoader({"gallery.html.j2": _TEMPLATE})],
                            template_file="gallery.html.j2")
    body, _ = exporter.from_notebook_node(nbformat.read(str(ipynb), as_version=4))
    body = _REMOTE.sub("", body)  # belt and braces: nothing remote may remain
    Path(html_path).write_text(body, encoding="utf-8")
    return Path(html_path)


def error_anchor(ipynb: str | Path, cell_index: int | None) -> str | None:
    """The HTML anchor of a cell (`cell-id=<id>`, what nbconvert writes), for a link to a failing cell."""
    if cell_index is None:
        return None
    nb = nbformat.read(str(ipynb), as_version=4)
    if 0 <= cell_index < len(nb.cells) and nb.cells[cell_index].get("id"):
        return f"cell-id={nb.cells[cell_index]['id']}"
    return None


def extract_last_png(ipynb: str | Path, png_path: str | Path) -> Path | None:
    """Write the notebook's last image/png output to `png_path` (thumbnail fallback)."""
    nb = nbformat.read(str(ipynb), as_version=4)
    last = None
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {}).get("image/png")
            if data:
                last = data
    if last is None:
        return None
    Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    Path(png_path).write_bytes(base64.b64decode(last if isinstance(last, str) else "".join(last)))
    return Path(png_path)


def complete_entry(run_dir: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """Render the entry's notebook to HTML and find its thumbnail and error anchor (in place)."""
    if not entry.get("output"):
        return entry
    ipynb = run_dir / entry["output"]
    if not ipynb.exists():
        return entry
    html_path = ipynb.with_suffix(".html")
    try:
        render_html(ipynb, html_path)
        entry["html"] = str(html_path.relative_to(run_dir))
    except Exception as e:  # a report must not fail the run
        entry["html_error"] = f"{type(e).__name__}: {e}"
    figure = run_dir / "figures" / f"{entry['notebook']}.png"
    if not figure.exists():
        extract_last_png(ipynb, figure)
    if figure.exists():
        entry["figure"] = str(figure.relative_to(run_dir))
    if entry.get("error") and entry["error"].get("cell") is not None:
        entry["error"]["anchor"] = error_anchor(ipynb, entry["error"]["cell"])
        nb = nbformat.read(str(ipynb), as_version=4)
        if entry["error"]["cell"] < len(nb.cells):
            entry["error"]["execution_count"] = nb.cells[entry["error"]["cell"]].get("execution_count")
    return entry


# ---------------------------------------------------------------------------------------------------
# Index page

_CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #1f2328; }
h1 { font-size: 22px; margin: 0 0 4px; } .meta { color: #57606a; margin-bottom: 16px; }
table { border-collapse: collapse; width: 100%; } th, td { border-bottom: 1px solid #d0d7de; padding: 8px;
vertical-align: top; text-align: left; } th { background: #f6f8fa; font-weight: 600; }
.status { display: inline-block; padding: 2px 8px; border-radius: 10px; font-weight: 600; color: #fff; }
.passed { background: #1a7f37; } .failed { background: #cf222e; } .pending { background: #9a6700; }
.kv { margin: 0; padding: 0; list-style: none; font-family: ui-monospace, monospace; font-size: 12px; }
.kv b { font-weight: 700; } .small { font-size: 12px; color: #57606a; } .err { color: #cf222e; }
img.thumb { width: 260px; border: 1px solid #d0d7de; background: #fff; }
code { background: #f6f8fa; padding: 1px 4px; border-radius: 4px; }
"""


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def _host_text(entry: dict[str, Any], run_host: dict[str, Any]) -> str:
    host = entry.get("host") or {}
    metrics, params = entry.get("metrics") or {}, entry.get("all_parameters") or entry.get("parameters") or {}
    gpus = host.get("gpus", run_host.get("gpus", 0)) or 0
    gpu_name = host.get("gpu_name") or run_host.get("gpu_name")
    where = (f"GPU × {gpus}" + (f" ({gpu_name})" if gpu_name else "")) if gpus else \
        f"CPU ({host.get('cpus', run_host.get('cpus', '?'))} cores)"
    processes = next((metrics[k] for k in ("processes", "world_size", "num_processes") if k in metrics),
                     params.get("processes"))
    parts = [where]
    if isinstance(processes, int) and not isinstance(processes, bool):
        on = f" on {metrics['device']}" if metrics.get("device") else ""
        parts.append(f"{processes} process{'es' if processes != 1 else ''}{on}")
    elif processes is not None:
        parts.append(f"processes={processes!r}")
    return "<br>".join(html.escape(str(p)) for p in parts)


def _link(href: str, text: str, **attrs: str) -> str:
    extra = "".join(f' {k}="{html.escape(v)}"' for k, v in attrs.items())
    return f'<a href="{html.escape(href)}"{extra}>{html.escape(text)}</a>'


def _row(entry: dict[str, Any], run_host: dict[str, Any]) -> str:
    name, status = entry["notebook"], entry.get("status", "pending")
    cells = []
    title = _link(entry["html"], name) if entry.get("html") else html.escape(name)
    if entry.get("output"):
        title += f'<br><span class="small">{_link(entry["output"], "ipynb")}</span>'
    cells.append(title)
    badge = f'<span class="status {html.escape(status)}">{html.escape(status)}</span>'
    error = entry.get("error")
    if error:
        what = f"{error.get('ename')}: {error.get('evalue')}"
        where = f" In [{error['execution_count']}]" if error.get("execution_count") else (
            f" (cell {error['cell']})" if error.get("cell") is not None else "")
        if entry.get("html") and error.get("anchor"):
            badge += f'<br><span class="small err">{_link(entry["html"] + "#" + error["anchor"], "failing cell" + where)}'
            badge += f"</span><br><span class=\"small err\">{html.escape(what[:300])}</span>"
        else:
            badge += f'<br><span class="small err">{html.escape(what[:300] + where)}</span>'
    cells.append(badge)
    cells.append(f"{entry['seconds']:.1f} s" if isinstance(entry.get("seconds"), (int, float)) else "")
    metrics = entry.get("metrics") or {}
    cells.append('<ul class="kv">' + "".join(f"<li>{html.escape(k)}: {html.escape(_fmt(v))}</li>"
                                              for k, v in metrics.items()) + "</ul>")
    overrides = entry.get("parameters") or {}
    params = entry.get("all_parameters") or overrides
    cells.append('<ul class="kv">' + "".join(
        f"<li>{'<b>' if k in overrides else ''}{html.escape(k)}={html.escape(repr(v))}{'</b>' if k in overrides else ''}</li>"
        for k, v in params.items()) + "</ul>")
    cells.append(_host_text(entry, run_host))
    if entry.get("figure"):
        cells.append(_link(entry["figure"], "").replace(
            "></a>", f'><img class="thumb" src="{html.escape(entry["figure"])}" alt="main figure of {html.escape(name)}"></a>'))
    else:
        cells.append('<span class="small">no figure</span>')
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def write_index(run_dir: str | Path, summary: dict[str, Any]) -> Path:
    """index.html: one row per notebook (status, wall time, metrics, parameters, host, thumbnail)."""
    run_dir = Path(run_dir)
    host = summary.get("host", {})
    entries = summary.get("notebooks", [])
    passed = sum(e.get("status") == "passed" for e in entries)
    failed = sum(e.get("status") == "failed" for e in entries)
    pending = len(entries) - passed - failed
    host_line = (f"{host.get('hostname', '?')}: {host.get('cpus', '?')} CPUs, {host.get('gpus', 0)} GPU(s)"
                 + (f" ({host['gpu_name']})" if host.get("gpu_name") else "")
                 + (f", torch {host['torch']}" if host.get("torch") else ""))
    counts = f"{passed} passed, {failed} failed" + (f", {pending} pending" if pending else "")
    tracking = summary.get("tracking_uri")
    links = [_link(n, n) for n in ("summary.json", "summary.md") if (run_dir / n).exists()]
    footer = ""
    if tracking:
        footer = ("<p class=\"small\">Experiment tracking (MLflow, one run per notebook, tag "
                  f"<code>gallery.run_id = {html.escape(str(summary.get('run')))}</code>): "
                  f"<code>mlflow ui --backend-store-uri {html.escape(tracking)}</code></p>")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Gallery run {html.escape(str(summary.get('run')))}</title>
<link rel="icon" href="data:,">
<style>{_CSS}</style></head>
<body>
<h1>Gallery run {html.escape(str(summary.get('run')))}</h1>
<div class="meta">{html.escape(host_line)} · {html.escape(counts)}
{('· started ' + html.escape(str(summary['started']))) if summary.get('started') else ''}
{('· ' + ' · '.join(links)) if links else ''}</div>
<table>
<thead><tr><th>notebook</th><th>status</th><th>wall time</th><th>metrics</th><th>parameters</th><th>host</th>
<th>main figure</th></tr></thead>
<tbody>
{chr(10).join(_row(e, host) for e in entries)}
</tbody></table>
{footer}
<p class="small">Parameters in bold were given on the command line; the others are the notebook's defaults.
Generated {html.escape(dt.datetime.now().isoformat(timespec='seconds'))}.</p>
</body></html>
"""
    path = run_dir / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def build_report(run_dir: str | Path) -> Path:
    """Render every notebook of a run folder, find thumbnails, write index.html (and update summary.json)."""
    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    for entry in summary.get("notebooks", []):
        complete_entry(run_dir, entry)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return write_index(run_dir, summary)


# ---------------------------------------------------------------------------------------------------
# Comparison

_LOWER = re.compile(r"loss|error|err\b|diff|perplexity|ppl|mse|mae|rmse|nll|wer|cer|distance|_gap", re.I)
_HIGHER = re.compile(r"acc|auc|map\b|\bmap|f1|precision|recall|score|ndcg|hit|iou|r2|bleu|rouge|reward|win_rate", re.I)
_TIMING = re.compile(r"seconds|_secs?\b|_s$|time|latency|throughput|per_s(ec)?\b|_per_|samples_s|tokens_s|it_s", re.I)


@dataclass
class Change:
    notebook: str
    metric: str
    before: Any
    after: Any
    verdict: str  # "regression", "improved", "changed", "missing", "added", "fixed"
    note: str = ""

    @property
    def relative(self) -> float | None:
        if isinstance(self.before, (int, float)) and isinstance(self.after, (int, float)) and self.before:
            return (self.after - self.before) / abs(self.before)
        return None


def direction(metric: str, overrides: dict[str, str] | None = None) -> str:
    """'higher', 'lower' (which way is better) or 'either' (unknown: any move counts), from the name."""
    if overrides and metric in overrides:
        return overrides[metric]
    if _LOWER.search(metric) or _TIMING.search(metric):
        return "lower" if not re.search(r"throughput|_per_|per_s|samples_s|tokens_s|it_s", metric, re.I) else "higher"
    if _HIGHER.search(metric):
        return "higher"
    return "either"


def load_run(source: str | Path) -> dict[str, dict[str, Any]]:
    """{notebook: {"status", "seconds", "metrics"}} from a run folder, its summary.json, or a baseline
    JSON ({notebook: {metric: value}} or {"notebooks": {notebook: {"metrics": {...}}}})."""
    path = Path(source)
    if path.is_dir():
        path = path / "summary.json"
    if not path.exists():
        raise SystemExit(f"{source}: no such run folder or JSON file (a run folder holds summary.json)")
    data = json.loads(path.read_text())
    notebooks = data.get("notebooks", data) if isinstance(data, dict) else data
    out: dict[str, dict[str, Any]] = {}
    if isinstance(notebooks, list):
        for e in notebooks:
            out[e["notebook"]] = {"status": e.get("status"), "seconds": e.get("seconds"),
                                  "metrics": e.get("metrics") or {}}
    elif isinstance(notebooks, dict):
        for name, e in notebooks.items():
            metrics = e.get("metrics", e) if isinstance(e, dict) else {}
            out[name] = {"status": e.get("status") if "metrics" in e else None, "seconds": e.get("seconds"),
                         "metrics": metrics}
    else:
        raise SystemExit(f"{source}: not a gallery summary or baseline JSON")
    return out


def parse_tolerances(items: list[str]) -> tuple[float, dict[str, float]]:
    """['0.02', 'test_accuracy=0.005', '01_ddp_mlp:loss=0.1'] -> (default, {key: tolerance})."""
    default, per = 0.05, {}
    for item in items:
        key, sep, value = item.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            raise SystemExit(f"--tolerance {item!r}: write a relative tolerance (0.05 = 5%) or NAME=0.05") from None
        if sep:
            per[key] = number
        else:
            default = number
    return default, per


def compare(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], tolerance: float = 0.05,
            tolerances: dict[str, float] | None = None, abs_tolerance: float = 1e-6, timings: bool = False,
            directions: dict[str, str] | None = None) -> tuple[list[Change], int]:
    """Changes beyond tolerance between two runs, and how many metrics stayed within it.

    Floats are measurements: moved when |after - before| > max(tolerance * |before|, abs_tolerance);
    a move the wrong way (by `direction`) is a regression, a move of unknown direction too. Integers,
    strings and booleans (process counts, devices) are configuration: a difference is 'changed', not a
    regression. Timings (seconds, throughput) depend on the machine's load and are skipped unless
    `timings`. A notebook that passed before and fails now is a regression.
    """
    tolerances = tolerances or {}
    changes, within = [], 0
    for name in sorted(set(before) | set(after)):
        if name not in after:
            changes.append(Change(name, "(notebook)", "ran", "not run", "missing"))
            continue
        if name not in before:
            changes.append(Change(name, "(notebook)", "not run", after[name].get("status"), "added"))
            continue
        a, b = before[name], after[name]
        if a.get("status") == "passed" and b.get("status") not in (None, "passed"):
            changes.append(Change(name, "(status)", "passed", b.get("status"), "regression", "the notebook now fails"))
        elif a.get("status") not in (None, "passed") and b.get("status") == "passed":
            changes.append(Change(name, "(status)", a.get("status"), "passed", "fixed"))
        ma, mb = dict(a.get("metrics") or {}), dict(b.get("metrics") or {})
        if timings and a.get("seconds") is not None and b.get("seconds") is not None:
            ma["wall_seconds"], mb["wall_seconds"] = a["seconds"], b["seconds"]
        for metric in sorted(set(ma) | set(mb), key=lambda k: (list(ma) + list(mb)).index(k)):
            if _TIMING.search(metric) and not timings:
                continue
            if metric not in mb:
                if b.get("status") == "passed" or b.get("status") is None:
                    changes.append(Change(name, metric, ma[metric], None, "missing"))
                continue
            if metric not in ma:
                changes.append(Change(name, metric, None, mb[metric], "added"))
                continue
            va, vb = ma[metric], mb[metric]
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
            numeric = numbers and (isinstance(va, float) or isinstance(vb, float))
            if not numeric:
                if va != vb:
                    changes.append(Change(name, metric, va, vb, "changed", "configuration or count"))
                else:
                    within += 1
                continue
            if not (math.isfinite(va) and math.isfinite(vb)):
                changes.append(Change(name, metric, va, vb, "regression", "not finite"))
                continue
            tol = tolerances.get(f"{name}:{metric}", tolerances.get(metric, tolerance))
            if abs(vb - va) <= max(tol * abs(va), abs_tolerance):
                within += 1
                continue
            better = direction(metric, directions)
            if better == "either":
                changes.append(Change(name, metric, va, vb, "regression",
                                      "moved; direction unknown (say which way is better with --direction)"))
            elif (vb > va) == (better == "higher"):
                changes.append(Change(name, metric, va, vb, "improved", f"{better} is better"))
            else:
                changes.append(Change(name, metric, va, vb, "regression", f"{better} is better"))
    return changes, within


def format_changes(changes: list[Change], within: int, label_a: str, label_b: str, tolerance: float) -> str:
    lines = [f"compare {label_a} -> {label_b} (relative tolerance {tolerance:g})"]
    if changes:
        width = max(len(c.notebook) for c in changes)
        mwidth = max(len(c.metric) for c in changes)
        for c in changes:
            rel = f"{c.relative:+.2%}" if c.relative is not None else ""
            lines.append(f"  {c.notebook:<{width}}  {c.metric:<{mwidth}}  {_fmt(c.before):>10} -> {_fmt(c.after):<10} "
                         f"{rel:>9}  {c.verdict.upper()}" + (f" ({c.note})" if c.note else ""))
    regressions = sum(c.verdict == "regression" for c in changes)
    improved = sum(c.verdict in ("improved", "fixed") for c in changes)
    lines.append(f"{within} metric(s) within tolerance, {improved} improved, {regressions} regression(s), "
                 f"{len(changes) - regressions - improved} other change(s)")
    return "\n".join(lines)


def run_compare(a: str, b: str, tolerance_items: list[str] = (), abs_tolerance: float = 1e-6,
                timings: bool = False, direction_items: list[str] = ()) -> int:
    """Print the comparison; 1 when there is a regression, else 0."""
    tolerance, per = parse_tolerances(list(tolerance_items))
    directions = {}
    for item in direction_items:
        key, _, value = item.partition("=")
        if value not in ("higher", "lower", "either"):
            raise SystemExit(f"--direction {item!r}: write NAME=higher, NAME=lower or NAME=either")
        directions[key] = value
    changes, within = compare(load_run(a), load_run(b), tolerance, per, abs_tolerance, timings, directions)
    print(format_changes(changes, within, str(a), str(b), tolerance))
    return 1 if any(c.verdict == "regression" for c in changes) else 0


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tolerance", action="append", default=[], metavar="[[NB:]METRIC=]REL",
                        help="relative tolerance for --compare/--baseline (default 0.05); repeat per metric")
    parser.add_argument("--abs-tolerance", type=float, default=1e-6,
                        help="changes smaller than this never count (metrics near zero)")
    parser.add_argument("--timings", action="store_true", help="also compare timings (wall time, seconds...)")
    parser.add_argument("--direction", action="append", default=[], metavar="METRIC=higher|lower",
                        help="which way is better, for a metric whose name does not say")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", help="a gallery run folder to (re)build the report of")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="run folders or baseline JSON files")
    add_compare_arguments(parser)
    args = parser.parse_args(argv)
    if args.compare:
        return run_compare(*args.compare, args.tolerance, args.abs_tolerance, args.timings, args.direction)
    if not args.run_dir:
        parser.error("give a run folder, or --compare BEFORE AFTER")
    print(build_report(args.run_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
