"""Build gpu-bundle/: the wheels the GPU machine lacks, for `make gpu-check` to carry there.

The GPU check is for a GPU machine without a package index: one that has Python, torch with CUDA and the
common scientific stack (`DEVICE_HAS` below lists what the machine it was written for has: Python 3.12,
torch 2.11 (CUDA 13), torchvision 0.26, transformers 5.17, lightning 2.6, torchmetrics 1.9, accelerate,
peft, pandas, pyarrow, matplotlib, scikit-learn and more), but cannot install packages. What the notebooks
need beyond that travels with the working tree, as wheels, and a transfer may be limited in size
(`--transfer-mib`, 64 MiB by default: working tree and wheels together). So this script downloads exactly
the wheels in `BUNDLE` below (`pip download --no-deps`, for cp312 manylinux x86_64), each one a package the
machine lacks, with the reason it is needed; full dependency resolution is not used, because it drags in
torch, boto3, google-cloud, azure... that are either there already or never imported. DeepSpeed is published
as a source distribution only: it is built here into a pure-Python wheel (`DS_BUILD_OPS=0`: no compiled ops;
DeepSpeed JIT-compiles an op only where a run asks for one, and notebook 05 asks for none), and the script
checks that the wheel is tagged `py3-none-any`.

Not carried at the default sizes, so notebook 06 (Ray Train) is reported skipped there: Ray (its manylinux
wheel alone is 79 MB for 2.60.0 cp312, over the whole default transfer). Of MLflow, only `mlflow-skinny`
travels: the notebooks save and load their trained model with it, and the gallery's tracking is off in the
check (`GALLERY_TRACKING=off`), so the tracking server's stack (the `mlflow` distribution, SQLAlchemy,
alembic) is never imported.

    python tools/gpu_bundle.py [--dest gpu-bundle] [--budget-mib 48] [--transfer-mib 64]

Writes `gpu-bundle/*.whl` and `gpu-bundle/manifest.json` (name, version, file, bytes, why), prints the
total, and exits non-zero with a clear message when the bundle is over its budget or when the working tree
plus the bundle would not fit the transfer limit. Wheels already in the folder are reused (a re-run
downloads nothing); wheels of other versions or packages are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DEST = ROOT / "gpu-bundle"
MIB = 2**20
TRANSFER_LIMIT = 64 * MIB  # the default most one transfer to the GPU machine carries: working tree + bundle
DEFAULT_BUDGET_MIB = 48  # for the bundle alone, leaving room for the working tree and its growth

PYTHON_VERSION = "3.12"
# pip matches manylinux tags exactly: list every glibc level the machine's Python accepts that wheels use
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    why: str


# Every package the GPU machine lacks that a notebook (or the check itself) imports, pinned to the
# versions of requirements.lock where those work with the machine's transformers 5 / torch 2.11.
BUNDLE: tuple[Wheel, ...] = (
    # --- executing notebooks: papermill, its Jupyter client, and the ipykernel the notebooks run in
    Wheel("papermill", "2.7.0", "executes the notebooks with parameters (helpers.gallery.execute)"),
    Wheel("entrypoints", "0.4.2", "papermill: engine registry"),
    Wheel("tenacity", "9.2.1", "papermill: retries"),
    Wheel("nbformat", "5.11.1", "reads/writes notebooks (helpers.gallery.execute, papermill)"),
    Wheel("fastjsonschema", "2.22.3", "nbformat: schema validation"),
    Wheel("jsonschema", "4.26.0", "nbformat: schema validation"),
    Wheel("jsonschema-specifications", "2025.9.1", "jsonschema"),
    Wheel("referencing", "0.37.0", "jsonschema"),
    Wheel("rpds-py", "2026.9.1", "referencing (compiled)"),
    Wheel("nbclient", "0.11.0", "papermill's notebook client"),
    Wheel("jupyter-client", "8.10.0", "nbclient: starts and talks to the kernel"),
    Wheel("jupyter-core", "5.9.1", "jupyter paths (kernel specs, runtime dir)"),
    Wheel("platformdirs", "4.14.8", "jupyter-core"),
    Wheel("traitlets", "5.16.1", "jupyter-client, ipykernel configuration"),
    Wheel("pyzmq", "27.3.0", "kernel messaging (compiled)"),
    Wheel("tornado", "6.6.1", "jupyter-client / ipykernel event loop (compiled)"),
    Wheel("ipykernel", "7.4.0", "the python3 kernel the notebooks run in"),
    Wheel("comm", "0.2.3", "ipykernel"),
    Wheel("debugpy", "1.8.22", "ipykernel imports it at start"),
    Wheel("matplotlib-inline", "0.2.2", "inline figures in the kernel"),
    Wheel("nest-asyncio2", "1.7.4", "ipykernel 7"),
    Wheel("ipython", "9.18.1", "ipykernel; IPython.display in notebooks and helpers"),
    Wheel("ipython-pygments-lexers", "1.1.1", "ipython"),
    Wheel("jedi", "0.20.1", "ipython"),
    Wheel("parso", "0.8.7", "jedi"),
    Wheel("pexpect", "4.9.0", "ipython"),
    Wheel("ptyprocess", "0.7.0", "pexpect"),
    Wheel("prompt-toolkit", "3.0.53", "ipython"),
    Wheel("wcwidth", "0.9.4", "prompt-toolkit"),
    Wheel("stack-data", "0.6.3", "ipython tracebacks"),
    Wheel("executing", "2.3.0", "stack-data"),
    Wheel("asttokens", "3.0.2", "stack-data"),
    Wheel("pure-eval", "0.2.4", "stack-data"),
    # --- 02: torchvision's CocoDetection reader and torchmetrics' mAP use pycocotools
    Wheel("pycocotools", "2.0.11", "02: COCO reader and mAP (compiled)"),
    Wheel("faster-coco-eval", "1.8.0", "02: mAP, torchmetrics' C++ COCO evaluation (compiled)"),
    # --- 03: MosaicML Streaming (MDS shards), with the codecs it imports at start (its other requirements,
    # cloud SDKs, are imported only for remote storage)
    Wheel("mosaicml-streaming", "0.13.0", "03: MDSWriter / StreamingDataset"),
    Wheel("zstd", "1.5.6.1", "03: streaming compression (compiled; the lock's 1.5.7.2 has no cp312 manylinux "
                           "wheel, 1.5.7.3 and 1.5.6.2 are yanked)"),
    Wheel("brotli", "1.2.1", "03: streaming.base.compression imports it (compiled)"),
    Wheel("python-snappy", "0.7.3", "03: streaming.base.compression imports snappy"),
    Wheel("cramjam", "2.14.0", "python-snappy's codec (compiled)"),
    Wheel("catalogue", "2.0.10", "03: streaming's registry"),
    # --- 05: DeepSpeed ZeRO under TRL's SFTTrainer, on datasets
    Wheel("deepspeed", "0.19.8", "05: ZeRO stages 0-3 (built here from the sdist: pure Python, ops JIT)"),
    Wheel("hjson", "3.1.0", "deepspeed"),
    Wheel("pydantic", "2.14.4", "deepspeed's config"),
    Wheel("pydantic-core", "2.50.5", "pydantic (compiled)"),
    Wheel("annotated-types", "0.8.0", "pydantic"),
    Wheel("typing-inspection", "0.4.5", "pydantic"),
    Wheel("trl", "1.16.0", "05: SFTTrainer (requires transformers>=4.56.2, no upper bound: 5.x is fine)"),
    Wheel("datasets", "5.0.1", "05: the SFT data set (TRL's input type)"),
    # the lock's multiprocess 0.70.15 has no Python 3.12 build (its wheels are per Python version): 0.70.16,
    # which needs dill>=0.3.8 (datasets takes dill<0.4.2, multiprocess<0.70.20)
    Wheel("dill", "0.3.8", "datasets"),
    Wheel("multiprocess", "0.70.16", "datasets (its py312 wheel: the code differs per Python version)"),
    # --- every notebook: its "Use the trained model" section saves the model in MLflow's format and loads it
    # back (tracking is off in the check, so nothing needs the tracking server, its database or its UI: the
    # `mlflow` distribution is not carried, `mlflow-skinny` holds the `mlflow` package). What `import mlflow`,
    # `mlflow.pytorch` and `mlflow.transformers` import when saving and loading a model, and nothing else.
    Wheel("mlflow-skinny", "3.17.2", "all: mlflow.pytorch / mlflow.transformers save_model and load_model"),
    Wheel("cachetools", "7.3.3", "mlflow"),
    Wheel("databricks-sdk", "0.162.0", "mlflow imports it at start"),
    Wheel("fastapi", "0.165.0", "mlflow imports it at start"),
    Wheel("starlette", "1.10.0", "fastapi"),
    Wheel("importlib-metadata", "9.1.0", "mlflow"),
    Wheel("opentelemetry-api", "1.45.2", "mlflow's tracing, imported at start"),
    Wheel("opentelemetry-sdk", "1.45.2", "mlflow's tracing"),
    Wheel("opentelemetry-proto", "1.45.2", "mlflow's tracing"),
    Wheel("opentelemetry-semantic-conventions", "0.66b2", "opentelemetry-sdk"),
    Wheel("sqlparse", "0.6.1", "mlflow imports it at start"),
    Wheel("cryptography", "50.0.2", "databricks-sdk imports it (compiled, abi3)"),
    Wheel("cffi", "2.1.1", "cryptography (compiled)"),
    Wheel("pycparser", "3.12", "cffi"),
)

BUILT_FROM_SDIST = {"deepspeed"}

# What the GPU machine the check was written for already has: never carried, so the machine's
# builds (its CUDA torch above all) are the ones that run.
DEVICE_HAS = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3
uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())

# Not carried, with the reason the check reports.
NOT_CARRIED = {
    "ray": "Ray's manylinux wheel alone (79 MB for 2.60.0 cp312) is more than the default transfer (64 MiB)",
    "mlflow": "the tracking server and UI: tracking is off in the check (GALLERY_TRACKING=off); the mlflow "
              "package the notebooks use comes with mlflow-skinny, which is carried",
}


class BundleError(SystemExit):
    """The bundle cannot be made or does not fit: the message says what to change."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(filename: str) -> tuple[str, str]:
    """(normalized distribution name, version) of a wheel file name."""
    parts = Path(filename).name.split("-")
    return normalize(parts[0]), parts[1]


def runs_on_device_python(filename: str, version: str = PYTHON_VERSION) -> bool:
    """Whether a wheel's Python tag fits the machine's Python: py3, py2.py3, cpXY with the abi3 ABI for XY
    up to the machine's, or exactly its version. pip also accepts an older `py311` for 3.12, but a package
    that builds per Python version (multiprocess) ships 3.11's code in it."""
    parts = Path(filename).name[:-len(".whl")].split("-")
    python_tags, abi = parts[-3].split("."), parts[-2]
    want = version.replace(".", "")
    for tag in python_tags:
        if tag in ("py3", f"py{want}", f"cp{want}"):
            return True
        if tag.startswith("cp") and abi == "abi3" and tag[2:].isdigit() and int(tag[3:]) <= int(want[1:]):
            return True
    return False


def check_list(bundle: tuple[Wheel, ...] = BUNDLE) -> None:
    """One version per package, none that the machine already has."""
    names = [normalize(w.name) for w in bundle]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise BundleError(f"gpu_bundle: {duplicates} listed twice in BUNDLE: keep one version of each.")
    shadowing = sorted(set(names) & DEVICE_HAS)
    if shadowing:
        raise BundleError(f"gpu_bundle: {shadowing} are on the GPU machine already: carrying them would "
                          "shadow its builds. Remove them from BUNDLE.")


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of the working tree a transfer sends besides the bundle: tracked and untracked-not-ignored
    files."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    total = 0
    for rel in out.decode().split("\0"):
        path = root / rel
        if rel and path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def check_budget(dest: Path, budget_bytes: int, tree: int = 0,
                 limit: int = TRANSFER_LIMIT) -> int:
    """The bundle's size in bytes; BundleError when it is over `budget_bytes` or, with the working tree
    (`tree` bytes), over what one transfer carries (`limit`)."""
    files = sorted(p for p in Path(dest).iterdir() if p.is_file())
    total = sum(p.stat().st_size for p in files)
    if total > budget_bytes:
        largest = sorted(files, key=lambda p: p.stat().st_size, reverse=True)[:5]
        listing = ", ".join(f"{p.name} ({p.stat().st_size / MIB:.1f} MiB)" for p in largest)
        raise BundleError(
            f"gpu_bundle: the bundle is {total / MIB:.1f} MiB, over its budget of "
            f"{budget_bytes / MIB:.1f} MiB (a transfer carries {limit / MIB:.0f} MiB with the working "
            f"tree). Largest: {listing}. Drop a package from BUNDLE (and report its notebook skipped), "
            "or raise --budget-mib if the tree leaves room.")
    if total + tree > limit:
        raise BundleError(
            f"gpu_bundle: the bundle ({total / MIB:.1f} MiB) and the working tree ({tree / MIB:.1f} MiB) "
            f"make {(total + tree) / MIB:.1f} MiB, over the {limit / MIB:.0f} MiB a transfer carries. "
            "Make the tree smaller (untracked files count) or the bundle, or raise --transfer-mib if the "
            "machine takes more.")
    return total


def _pip(python: str, *args: str, env: dict[str, str] | None = None) -> None:
    cmd = [python, "-m", "pip", *args]
    print("+", " ".join(cmd), flush=True)
    result = subprocess.run(cmd, env=env)
    if result.returncode:
        raise BundleError(f"gpu_bundle: pip failed ({result.returncode}): {' '.join(cmd)}")


def download(wheels: list[Wheel], dest: Path, python: str) -> None:
    """The binary wheels for the machine's Python and platform, without their dependencies."""
    if not wheels:
        return
    args = ["download", "--no-deps", "--only-binary=:all:", "--python-version", PYTHON_VERSION,
            "--implementation", "cp", "--abi", "cp" + PYTHON_VERSION.replace(".", ""), "--abi", "abi3",
            "--abi", "none", "--progress-bar", "off", "--quiet", "-d", str(dest)]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    # the machine's constraint file here caps torch; irrelevant for these and it would hide nothing
    _pip(python, *args, *[f"{w.name}=={w.version}" for w in wheels])


def build_from_sdist(wheel: Wheel, dest: Path, python: str) -> Path:
    """A pure-Python wheel from the sdist (DeepSpeed: no compiled ops, `DS_BUILD_OPS=0`)."""
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-sdist-") as tmp:
        _pip(python, "download", "--no-deps", "--no-binary=:all:", "--progress-bar", "off", "-d", tmp,
             f"{wheel.name}=={wheel.version}")
        sdists = [p for p in Path(tmp).iterdir() if p.name.endswith((".tar.gz", ".zip"))]
        if len(sdists) != 1:
            raise BundleError(f"gpu_bundle: expected one sdist of {wheel.name}, found {sdists}")
        env = dict(os.environ, DS_BUILD_OPS="0", DS_ACCELERATOR="cpu")
        out = Path(tmp) / "wheel"
        # --no-build-isolation: DeepSpeed's setup.py imports torch, which this environment has
        _pip(python, "wheel", "--no-deps", "--no-build-isolation", "--progress-bar", "off", "-w", str(out),
             str(sdists[0]), env=env)
        built = list(out.glob("*.whl"))
        if len(built) != 1 or not built[0].name.endswith("-py3-none-any.whl"):
            raise BundleError(f"gpu_bundle: {wheel.name} built {[p.name for p in built]}, not one "
                              "py3-none-any wheel: it would not install on the GPU machine's Python 3.12.")
        with zipfile.ZipFile(built[0]) as zf:
            compiled = [n for n in zf.namelist() if n.endswith((".so", ".pyd"))]
        if compiled:
            raise BundleError(f"gpu_bundle: the {wheel.name} wheel holds compiled files {compiled[:3]}: "
                              "built for this machine, not the GPU machine.")
        target = dest / built[0].name
        shutil.move(str(built[0]), target)
        return target


def build(dest: Path, budget_bytes: int, python: str = sys.executable, limit: int = TRANSFER_LIMIT,
          bundle: tuple[Wheel, ...] = BUNDLE) -> dict:
    check_list(bundle)
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {normalize(w.name): w for w in bundle}
    present: dict[str, Path] = {}
    for path in dest.glob("*.whl"):
        name, version = wheel_name(path.name)
        if name in wanted and version == wanted[name].version and name not in present:
            present[name] = path
        else:
            print(f"removing {path.name} (not in BUNDLE at that version)")
            path.unlink()
    missing = [w for n, w in wanted.items() if n not in present]
    download([w for w in missing if normalize(w.name) not in BUILT_FROM_SDIST], dest, python)
    for w in missing:
        if normalize(w.name) in BUILT_FROM_SDIST:
            build_from_sdist(w, dest, python)
    files = {wheel_name(p.name)[0]: p for p in dest.glob("*.whl")}
    absent = sorted(set(wanted) - set(files))
    if absent:
        raise BundleError(f"gpu_bundle: no wheel for {absent} in {dest}")
    other_python = sorted(p.name for p in files.values() if not runs_on_device_python(p.name))
    if other_python:
        raise BundleError(f"gpu_bundle: {other_python} are built for another Python than the GPU machine's "
                          f"{PYTHON_VERSION}: pick a version of each that has a {PYTHON_VERSION} wheel.")
    manifest = {
        "python": PYTHON_VERSION, "platforms": list(PLATFORMS),
        "not_carried": NOT_CARRIED,
        "wheels": [{"name": w.name, "version": w.version, "file": files[normalize(w.name)].name,
                    "bytes": files[normalize(w.name)].stat().st_size, "why": w.why} for w in bundle],
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = check_budget(dest, budget_bytes, tree_bytes(), limit)
    manifest["total_bytes"] = total
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="the bundle folder (git-ignored)")
    parser.add_argument("--budget-mib", type=float, default=DEFAULT_BUDGET_MIB,
                        help="the most the bundle may weigh (default %(default)s MiB)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose pip downloads (and which builds DeepSpeed: needs torch)")
    parser.add_argument("--transfer-mib", type=float, default=TRANSFER_LIMIT / MIB,
                        help="the most one transfer to the GPU machine carries, working tree and bundle "
                             "(default %(default)s MiB)")
    parser.add_argument("--check-only", action="store_true", help="only check the existing bundle's size")
    args = parser.parse_args(argv)
    budget, limit = int(args.budget_mib * MIB), int(args.transfer_mib * MIB)
    if args.check_only:
        total = check_budget(args.dest, budget, tree_bytes(), limit)
    else:
        manifest = build(args.dest, budget, args.python, limit)
        total = manifest["total_bytes"]
        for w in sorted(manifest["wheels"], key=lambda w: -w["bytes"]):
            print(f"{w['bytes'] / MIB:7.2f} MiB  {w['file']}")
    tree = tree_bytes()
    print(f"bundle: {total / MIB:.1f} MiB in {args.dest} (budget {budget / MIB:.0f} MiB); with the working "
          f"tree ({tree / MIB:.1f} MiB): {(total + tree) / MIB:.1f} of {limit / MIB:.0f} MiB a transfer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
