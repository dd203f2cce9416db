"""The gallery runner: execute notebooks with papermill, report on them, compare runs, store outputs.

One command line, `python -m helpers.gallery` (`--help` lists its modes). Modules: `runner` (a gallery
run), `execute` (one notebook, the same way everywhere; `make notebooks` stores with it), `notebook_io`
(reading executed notebooks), `report` (the HTML report), `compare` (two runs), `scale_up` (each
notebook's full-size command), `errors` (the one error type and its exit status). Importing this package
imports none of them, and none imports torch.
"""
