"""The `refusals` fixture: bad parameter sets of one notebook, run in one kernel until each is refused.

Its two ways of being wrong are tested here on a two-cell notebook (no torch, a second or two): a set that
inherits the previous set's values (the stored defaults must be restored before each set is injected), and
a set the notebook accepts (the test must fail, not pass quietly).
"""

import nbformat
import pytest

NOTEBOOK = [
    ("parameters", 'colour = "red"\nsize = 1'),
    (None, 'print(f"checking {colour} {size}")\n'
           'if colour not in ("red", "blue"):\n    raise ValueError(f"colour={colour!r}: use red or blue")\n'
           'if size < 1:\n    raise ValueError(f"size={size}: use 1 or more")'),
    (None, 'print("launching")'),
]


@pytest.fixture
def tiny(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for tag, source in NOTEBOOK:
        nb.cells.append(nbformat.v4.new_code_cell(source, metadata={"tags": [tag]} if tag else {}))
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_each_set_starts_from_the_defaults(refusals, tiny):
    colour, size = refusals(tiny, {"colour": "green"}, {"size": 0})
    assert colour.error == "ValueError: colour='green': use red or blue" and colour.cell == 1
    # the second set kept colour at its default: it is refused for its own value, not the first set's
    assert size.error == "ValueError: size=0: use 1 or more"
    assert size.output == "checking red 0\n" and "launching" not in size.output


def test_a_set_the_notebook_accepts_fails_the_test(refusals, tiny):
    with pytest.raises(pytest.fail.Exception, match=r"ran to the end with \{'colour': 'blue'\}"):
        refusals(tiny, {"colour": "blue"})


def test_an_unknown_parameter_is_refused_before_any_kernel(refusals, tiny):
    with pytest.raises(ValueError, match="shape"):
        refusals(tiny, {"shape": "round"})
