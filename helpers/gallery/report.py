"""The gallery run's HTML report (`python -m helpers.gallery --report runs/<stamp>` rebuilds one).

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

import datetime as dt
import html
import json
import re
from pathlib import Path
from typing import Any

import nbformat

from helpers.gallery.errors import GalleryError
from helpers.gallery.notebook_io import last_png
from helpers.metrics import format_metric

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
        png = last_png(ipynb)
        if png is not None:
            figure.parent.mkdir(parents=True, exist_ok=True)
            figure.write_bytes(png)
    if figure.exists():
        entry["figure"] = str(figure.relative_to(run_dir))
    error = entry.get("error")
    if error and error.get("cell_id"):
        error["anchor"] = f"cell-id={error['cell_id']}"  # what nbconvert writes for each cell
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
            link = _link(entry["html"] + "#" + error["anchor"], "failing cell" + where)
            badge += f'<br><span class="small err">{link}'
            badge += f"</span><br><span class=\"small err\">{html.escape(what[:300])}</span>"
        else:
            badge += f'<br><span class="small err">{html.escape(what[:300] + where)}</span>'
    cells.append(badge)
    cells.append(f"{entry['seconds']:.1f} s" if isinstance(entry.get("seconds"), (int, float)) else "")
    metrics = entry.get("metrics") or {}
    cells.append('<ul class="kv">' + "".join(f"<li>{html.escape(k)}: {html.escape(format_metric(v))}</li>"
                                              for k, v in metrics.items()) + "</ul>")
    overrides = entry.get("parameters") or {}
    params = entry.get("all_parameters") or overrides
    def param(k: str, v: Any) -> str:  # the ones given on the command line in bold
        text = f"{html.escape(k)}={html.escape(repr(v))}"
        return f"<li><b>{text}</b></li>" if k in overrides else f"<li>{text}</li>"

    cells.append('<ul class="kv">' + "".join(param(k, v) for k, v in params.items()) + "</ul>")
    cells.append(_host_text(entry, run_host))
    if entry.get("figure"):
        image = (f'<img class="thumb" src="{html.escape(entry["figure"])}" '
                 f'alt="main figure of {html.escape(name)}">')
        cells.append(_link(entry["figure"], "").replace("></a>", f">{image}</a>"))
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
    if not (run_dir / "summary.json").is_file():
        raise GalleryError(f"{run_dir}: no summary.json, so not a gallery run folder (python -m "
                           "helpers.gallery writes them under runs/)")
    summary = json.loads((run_dir / "summary.json").read_text())
    for entry in summary.get("notebooks", []):
        complete_entry(run_dir, entry)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return write_index(run_dir, summary)
