"""Every notebook's "scale up" command, checked where it is printed and executed on real-shaped stand-ins.

`helpers.gallery.scale_up.SCALE_UPS` holds one parameter set per notebook. The first tests prove the
notebooks' "Scaling up" sections print exactly those sets, read back the way papermill reads a command
line (so a list passed with `-p` as a string, say, is caught), and that the README's gallery table links each
notebook's "Scaling up" section, naming the machine the set is meant for. The others execute each notebook
with its set, on CPU, with these differences only, each named in `RUNS` with its reason:

* stand-ins for what cannot be downloaded or reached here: data folders (COCO 640 x 480 JPEGs, a MovieLens
  folder at the ml-25m shape, FashionMNIST's IDX files at full size), a saved Llama-3.2-shaped model folder,
  a ResNet-50 checkpoint file, a Ray cluster (started here; `cluster="auto"` finds it), an MLflow
  store (a local SQLite file in place of a server) and output folders;
* `max_steps` (the shared step cap) and, where one step at the advertised batch would take minutes on two
  CPU cores, a smaller batch and fewer parity steps.

nbval executes the defaults; these runs are the notebooks' other-parameter runs, so no notebook is executed
twice at the same parameters.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from helpers.gallery.execute import notebook_parameters
from helpers.gallery.notebook_io import record_metadata
from helpers.gallery.scale_up import SCALE_UPS, cli_parameters, inline, parse_parameters
from tests.support import NOTEBOOKS, display_text, stream_text

ROOT = NOTEBOOKS.parent


def _scaling_up_command(stem: str) -> str:
    """The papermill command in the notebook's "Scaling up" section."""
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    sections = ["".join(c["source"]) for c in nb["cells"]
                if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("## Scaling up")]
    assert len(sections) == 1, f"{stem}: expected one '## Scaling up' section, found {len(sections)}"
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", sections[0], re.S) if "papermill" in b]
    assert len(blocks) == 1, f"{stem}: expected one papermill command in 'Scaling up', found {len(blocks)}"
    assert f"notebooks/{stem}.ipynb" in blocks[0], f"{stem}: the command runs another notebook"
    return blocks[0]


def _readme_scale_up_cell(stem: str) -> str:
    """The "scale up" column of the notebook's row in the README's gallery table."""
    text = (ROOT / "README.md").read_text()
    assert text.count("<!-- gallery-table -->") == 1 and text.count("<!-- /gallery-table -->") == 1, (
        "README: the gallery table lies between one <!-- gallery-table --> and one <!-- /gallery-table -->")
    table = text.split("<!-- gallery-table -->")[1].split("<!-- /gallery-table -->")[0]
    rows = [line for line in table.splitlines()
            if line.startswith("| [") and f"(notebooks/{stem}.ipynb)" in line]
    assert len(rows) == 1, f"README: expected one gallery-table row for {stem}, found {len(rows)}"
    return rows[0].rstrip(" |").rsplit(" | ", 1)[1]


def _gallery_rows(text: str) -> list[str]:
    """The notebooks the README's gallery table links in its first column, in its order."""
    table = text.split("<!-- gallery-table -->")[1].split("<!-- /gallery-table -->")[0]
    return re.findall(r"^\| \[[^\]]+\]\(notebooks/(\d\d_\w+)\.ipynb\)", table, re.M)


def test_readme_has_one_row_per_notebook():
    """Every notebook in notebooks/ has its row in the gallery table, in order; no row names another."""
    notebooks = [p.stem for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))]
    assert _gallery_rows((ROOT / "README.md").read_text()) == notebooks, (
        "README: the gallery table should have one row per notebook, in order")
    tour = _readme_scale_up_cell("00_getting_started")   # it scales nothing: its column links the map
    assert tour == "[where to go next](notebooks/00_getting_started.ipynb#Where-to-go-next)", tour
    assert _heading_anchors("00_getting_started")["Where-to-go-next"] == "Where to go next"
    missing = "<!-- gallery-table -->\n| [01 DDP](notebooks/01_ddp_mlp.ipynb) | x |\n<!-- /gallery-table -->"
    assert _gallery_rows(missing) == ["01_ddp_mlp"] != notebooks   # the comparison sees a missing row


def _heading_anchors(stem: str) -> dict[str, str]:
    """Every heading of the notebook's markdown, by the anchor Jupyter gives it (JupyterLab, nbconvert and
    nbviewer: the heading's text with spaces turned into hyphens)."""
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    prose = [re.sub(r"^```.*?^```", "", "".join(c["source"]), flags=re.M | re.S)   # not a shell comment
             for c in nb["cells"] if c["cell_type"] == "markdown"]
    headings = [m[1].strip() for text in prose for m in re.finditer(r"^#{1,6} +(.+)$", text, re.M)]
    return {heading.replace(" ", "-"): heading for heading in headings}


@pytest.mark.parametrize("stem", sorted(SCALE_UPS))
def test_notebook_prints_the_scale_up_set(stem):
    expected = SCALE_UPS[stem].parameters
    declared = notebook_parameters(NOTEBOOKS / f"{stem}.ipynb")
    assert not set(expected) - set(declared), f"{stem} declares no {sorted(set(expected) - set(declared))}"
    assert cli_parameters(stem) == expected, "the printed command does not give the notebook these values"
    assert parse_parameters(_scaling_up_command(stem)) == expected, (
        f"{stem}'s 'Scaling up' command differs from helpers.gallery.scale_up; print it with "
        f"`python -m helpers.gallery --scale-up {stem[:2]}` and paste it")


@pytest.mark.parametrize("stem", sorted(SCALE_UPS))
def test_readme_links_the_scaling_up_section(stem):
    """The README's row names where the run is meant for and links the section that holds the command."""
    cell = _readme_scale_up_cell(stem)
    links = re.findall(r"\[([^\]]+)\]\(([^)#\s]+)#([^)\s]+)\)", cell)
    assert len(links) == 1, f"README's scale-up column for {stem} should link a notebook section: {cell}"
    text, target, anchor = links[0]
    assert target == f"notebooks/{stem}.ipynb", f"README's scale-up link for {stem} goes to {target}"
    anchors = _heading_anchors(stem)
    assert anchor in anchors, f"{stem} has no heading with the anchor #{anchor}; it has {sorted(anchors)}"
    assert anchors[anchor] == "Scaling up", f"README's scale-up link for {stem} goes to '{anchors[anchor]}'"
    where = SCALE_UPS[stem].where
    assert text == where, f"README's scale-up for {stem}: [{where}](notebooks/{stem}.ipynb#{anchor})"


def test_a_drifted_command_is_caught():
    """The comparison bites: one changed value, a list given with -p, a missing parameter."""
    good = inline("04_fsdp_transformer")
    assert parse_parameters(good) == SCALE_UPS["04_fsdp_transformer"].parameters
    assert parse_parameters(good.replace("-p steps 5000", "-p steps 500")) != SCALE_UPS[
        "04_fsdp_transformer"].parameters
    listed = parse_parameters("-p anchor_ratios '[0.5, 1.0, 2.0]'")
    assert listed["anchor_ratios"] == "[0.5, 1.0, 2.0]"      # what -p really gives: a string, not a list
    assert parse_parameters("-y 'anchor_ratios: [0.5, 1.0, 2.0]'")["anchor_ratios"] == [0.5, 1.0, 2.0]


# --- the runs ----------------------------------------------------------------------------------------------

def _coco(tmp: Path) -> dict[str, Any]:
    from helpers.data.coco_shapes import build_coco_shapes

    # COCO's own layout, image shape and format; objects sized like COCO's medium ones. Eight validation
    # images: on two, the untrained model's mAP@0.5 is chance and can pass the 0.1 the notebook asserts
    coco = build_coco_shapes(tmp / "coco", n_train=4, n_val=8, image_size=640, image_height=480,
                             image_format="jpg", min_size=40, max_size=160)
    weights = tmp / "resnet50.pth"
    import torch
    import torchvision

    torch.manual_seed(0)   # the same stand-in backbone every run
    torch.save(torchvision.models.resnet50().state_dict(), weights)   # torchvision's checkpoint layout
    return dict(data_path=str(coco.root), weights_path=str(weights), output_dir=str(tmp / "ckpt"))


def _movielens(tmp: Path) -> dict[str, Any]:
    from helpers.data.movielens import build_movielens_shaped

    files = build_movielens_shaped(tmp / "ml-25m-shaped")
    return dict(data_path=str(files.ratings_csv.parent), tracking_uri=f"sqlite:///{tmp}/mlflow.db",
                mds_dir=str(tmp / "mds"))


def _llama(tmp: Path) -> dict[str, Any]:
    from helpers.data.sft_tasks import build_sft_tasks
    from helpers.models.llama import build_llama_checkpoint

    chats = build_sft_tasks("sort", n_train=256, n_test=16, root=tmp / "chats")   # as if the user's JSONL
    return dict(model_name=str(build_llama_checkpoint(tmp / "llama")), dataset_path=str(chats["train"]),
                output_dir=str(tmp / "llama-sft"))


def _as_data_path(stand_ins: dict[str, Any]) -> dict[str, Any]:
    """The user's JSONL as `data_path`, the gallery's one name for a notebook's data."""
    return {"data_path" if name == "dataset_path" else name: value for name, value in stand_ins.items()}


def _fashion(tmp: Path) -> dict[str, Any]:
    from helpers.data import fashion_idx

    return dict(data_path=str(fashion_idx.build(tmp / "fashion", train_size=60000, test_size=10000)),
                output_dir=str(tmp / "ray-results"), tracking_uri=f"sqlite:///{tmp}/mlflow.db")


def _gpt_oss(tmp: Path) -> dict[str, Any]:
    from helpers.data.sft_tasks import build_sft_tasks
    from helpers.models.gpt_oss import build_gpt_oss_checkpoint

    chats = build_sft_tasks("sort", n_train=256, n_test=16, root=tmp / "chats")   # as if the user's JSONL
    return dict(model_name=str(build_gpt_oss_checkpoint(tmp / "gpt-oss-120b", mxfp4=True)),
                data_path=str(chats["train"]), output_dir=str(tmp / "gpt-oss-120b-lora"))


def _olmo3(tmp: Path) -> dict[str, Any]:
    """An OLMo-3-shaped folder (Olmo3ForCausalLM, a BPE tokenizer with a chat template and no pad token), as
    allenai/Olmo-3-7B-Instruct would be downloaded, and the user's JSONL."""
    import torch
    from transformers import AutoTokenizer, Olmo3Config, Olmo3ForCausalLM

    from helpers.data.sft_tasks import build_sft_tasks
    from helpers.models.llama import build_llama_checkpoint

    chats = build_sft_tasks("sort", n_train=256, n_test=16, root=tmp / "chats")   # as if the user's JSONL
    tokenizer = AutoTokenizer.from_pretrained(build_llama_checkpoint(tmp / "llama"))
    config = Olmo3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=256,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, sliding_window=32,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=None)
    torch.manual_seed(0)
    Olmo3ForCausalLM(config).save_pretrained(tmp / "olmo3")
    tokenizer.save_pretrained(tmp / "olmo3")
    return dict(model_name=str(tmp / "olmo3"), data_path=str(chats["train"]),
                output_dir=str(tmp / "olmo3-lora"))


# stand-ins (built in the test's folder), then the smaller settings a 2-core CPU needs, with the reason
RUNS: dict[str, dict[str, Any]] = {
    "01_ddp_mlp": dict(stand_ins=None, cap=dict(max_steps=6), why=""),
    "02_ddp_retinanet": dict(
        stand_ins=_coco, cap=dict(max_steps=2, batch_size=2, parity_steps=1, image_size=320),
        why="a step of 64 images at 800 px through ResNet-50-FPN is about 30 TFLOP (minutes on 2 cores) and "
            "needs over 30 GB of activations; even one image at 800 px takes a rank tens of seconds a pass, "
            "so the 640 x 480 JPEGs are resized to 320 px"),
    "03_lightning_two_tower_mds": dict(
        stand_ins=_movielens, cap=dict(max_steps=2, eval_users=2000),
        why="scoring 10,000 users against all 59,047 movies, before training and after each of the two "
            "capped epochs, was 25-30 s of a 86 s run on 2 cores; 2,000 users take the same code path"),
    "04_fsdp_transformer": dict(
        stand_ins=lambda tmp: dict(output_dir=str(tmp / "ckpt")),
        cap=dict(max_steps=3, batch_size=16, parity_steps=2, eval_batches=1),
        why="one step of 256 x 256 tokens through the 10M model is about 4 TFLOP (a minute on 2 cores)"),
    "05_deepspeed_zero_sft": dict(stand_ins=lambda tmp: _as_data_path(_llama(tmp)),
                                  cap=dict(max_steps=2, n_test=8), why=""),
    "06_ray_train_resnet": dict(stand_ins=_fashion, cap=dict(max_steps=2, processes=4),
                                why="8 Ray Train workers do not fit 2 cores; 4 share them"),
    "07_trl_sft_gpt_oss": dict(stand_ins=_gpt_oss, cap=dict(max_steps=2, n_test=8), why=""),
    "08_unsloth_llama": dict(   # 08 calls the user's data data_path
        stand_ins=lambda tmp: {"data_path" if k == "dataset_path" else k: v for k, v in _llama(tmp).items()},
        cap=dict(max_steps=2, n_test=8, compare_plain=True, compare_steps=3),
        why="not a cut: the plain TRL + PEFT comparison, on by default only on GPUs, runs here too"),
    "09_axolotl_olmo3": dict(
        stand_ins=_olmo3, cap=dict(max_steps=2, n_test=8, load_in_4bit=True),
        why="not a cut: QLoRA, on by default only on GPUs, runs here too (bitsandbytes' CPU 4-bit weights)"),
    "10_fast_and_elastic": dict(
        stand_ins=lambda tmp: dict(output_dir=str(tmp / "nb10")),
        cap=dict(max_steps=2, batch_size=16, profile_steps=1, compile_model=False),
        why="one step of 256 x 256 tokens through the 10M model is about 4 TFLOP (a minute on 2 cores); "
            "compiling the 10M model takes 30 s here (nbval's run compiles the tiny one, same code)"),
}


def _run_parameters(stem: str, tmp: Path) -> dict[str, Any]:
    run = RUNS[stem]
    params = dict(cli_parameters(stem))
    stand_ins = run["stand_ins"](tmp) if run["stand_ins"] else {}
    unknown = (set(stand_ins) | set(run["cap"])) - set(notebook_parameters(NOTEBOOKS / f"{stem}.ipynb"))
    assert not unknown, f"{stem} declares no {sorted(unknown)}"
    return {**params, **stand_ins, **run["cap"]}


@pytest.mark.notebook
def test_01_scale_up(run_notebook, tmp_path):
    nb, metrics = run_notebook("01_ddp_mlp", **_run_parameters("01_ddp_mlp", tmp_path))
    params = record_metadata(nb)["params"]
    assert params["batch_size"] == 512 and params["epochs"] == 30
    assert "Not compared with the reference run" in display_text(nb)


@pytest.mark.notebook
def test_02_scale_up_resnet50_on_coco_sized_jpegs(run_notebook, tmp_path):
    nb, metrics = run_notebook("02_ddp_retinanet", **_run_parameters("02_ddp_retinanet", tmp_path))
    out = stream_text(nb)
    assert "[rank0] rank 0/2 on cpu: 2 training images, 4 validation images" in out
    params = record_metadata(nb)["params"]
    assert params["backbone"] == "resnet50_fpn_v2" and params["num_workers"] == 8
    assert list(Path(params["output_dir"]).glob("retinanet_resnet50_fpn_v2_best.pt"))
    assert "Not compared with the reference run" in display_text(nb)


@pytest.mark.notebook
def test_03_scale_up_at_the_ml25m_shape(run_notebook, tmp_path, monkeypatch):
    """162,541 users x 59,047 movies: the driver stays under 4 GB; Lightning and record_metrics log one
    MLflow run to the store given by `tracking_uri`."""
    import mlflow

    monkeypatch.setenv("GALLERY_TRACKING", "on")
    params = _run_parameters("03_lightning_two_tower_mds", tmp_path)
    nb, metrics = run_notebook("03_lightning_two_tower_mds", **params)
    out = stream_text(nb)
    assert "by 162,541 users of 59,047 movies" in out, "the data did not have the ml-25m shape"
    assert metrics["driver_peak_rss_mb"] < 4096, f"the driver peaked at {metrics['driver_peak_rss_mb']} MB"
    client = mlflow.tracking.MlflowClient(params["tracking_uri"])
    runs = client.search_runs([client.get_experiment_by_name("03_lightning_two_tower_mds").experiment_id])
    assert len(runs) == 1, f"{len(runs)} MLflow runs for one notebook run"
    assert runs[0].data.metrics["recall_at_10"] == pytest.approx(metrics["recall_at_10"])
    # Lightning's logger wrote one validation recall per epoch into the same run
    assert len(client.get_metric_history(runs[0].info.run_id, "val_recall_at_10")) == 2
    assert "[rank0] rank 0/2 on cpu" in out and "cluster environment TorchElasticEnvironment" in out
    assert "Streaming segments left in /dev/shm: none" in out
    # epochs cut short by the step cap: Streaming's threads must not outlive the rank's shared memory
    assert "Invalid shard state" not in out and "exception calling callback" not in out, (
        "Streaming's download threads outlived fit")


@pytest.mark.notebook
def test_04_scale_up_10m_preset(run_notebook, tmp_path):
    nb, metrics = run_notebook("04_fsdp_transformer", **_run_parameters("04_fsdp_transformer", tmp_path))
    assert 9e6 < metrics["parameters"] < 12e6, metrics["parameters"]
    assert metrics["parity_max_abs_diff"] < 1e-4
    assert list((tmp_path / "ckpt").iterdir()), "no checkpoint in output_dir"


@pytest.mark.notebook
def test_05_scale_up_saved_llama_folder(run_notebook, tmp_path):
    """A Llama-3.2-shaped folder (BPE tokenizer, Llama 3's template, no pad token) through the same
    AutoModel/AutoTokenizer path as a real checkpoint, on a JSONL of the user's chats: scored in the ranks
    before and after training, saved, with the stage-parity pass skipped."""
    nb, metrics = run_notebook("05_deepspeed_zero_sft", **_run_parameters("05_deepspeed_zero_sft", tmp_path))
    assert (tmp_path / "llama-sft" / "config.json").is_file()   # the fine-tuned model went where it was told
    assert metrics["zero_stage"] == 3 and 0 <= metrics["accuracy_after"] <= 1
    # run_parity=False: the four short runs were skipped (a non-finite metric is recorded as its text)
    assert math.isnan(float(metrics["parity_max_abs_diff"]))
    assert "largest loss difference from ZeRO-0" not in stream_text(nb)


@pytest.mark.notebook
def test_07_scale_up_mxfp4_gpt_oss_folder(run_notebook, tmp_path):
    """A GPT-OSS folder in the published MXFP4 layout (uint8 expert blocks and scales, `quant_method: mxfp4`)
    through the same path as openai/gpt-oss-120b: dequantized while loading, FSDP2 + LoRA on attention and
    experts with gradient checkpointing (rank 0 reads and dequantizes the checkpoint, rank 1 receives its
    shards), scored in the ranks before and after, and the adapter saved."""
    nb, metrics = run_notebook("07_trl_sft_gpt_oss", **_run_parameters("07_trl_sft_gpt_oss", tmp_path))
    assert (tmp_path / "gpt-oss-120b-lora" / "adapter_model.safetensors").is_file()
    assert metrics["strategy"] == "fsdp" and metrics["peft"] == "lora" and 0 <= metrics["accuracy_after"] <= 1
    out = stream_text(nb)
    assert "experts: MXFP4, dequantized to bf16 when loaded" in out and "run_parity=False" in out


@pytest.mark.notebook
def test_08_scale_up_llama_folder_with_unsloth(run_notebook, tmp_path):
    """A Llama-3.2-shaped folder (BPE tokenizer, Llama 3's template, no pad token) through Unsloth's loader
    as unsloth/Llama-3.2-3B-Instruct would go: LoRA only (the embeddings stay frozen for a real model), under
    DDP, the adapter saved, reloaded by FastLanguageModel and scored, on the user's JSONL; then the same steps
    timed with plain TRL + PEFT and with Unsloth, as on GPUs."""
    nb, metrics = run_notebook("08_unsloth_llama", **_run_parameters("08_unsloth_llama", tmp_path))
    assert (tmp_path / "llama-sft" / "adapter_model.safetensors").is_file()
    assert metrics["processes"] == 2 and 0 <= metrics["accuracy_after"] <= 1
    out = stream_text(nb)
    assert "LoRA r=16 on ['q_proj'" in out and "embed_tokens, lm_head in full" not in out
    assert "model wrapped in DistributedDataParallel" in out
    assert "plain TRL + PEFT: 3 steps" in out
    assert "the samples per second of plain TRL + PEFT, over 3 steps" in out
    assert metrics["unsloth_speedup_vs_plain"] > 0


@pytest.mark.notebook
def test_09_scale_up_olmo3_folder_with_axolotl(run_notebook, tmp_path):
    """An OLMo-3-shaped folder (BPE tokenizer with Llama 3's template, no pad token) through Axolotl as
    allenai/Olmo-3-7B-Instruct would go: the YAML names the folder and the user's JSONL, LoRA only (the
    embeddings stay frozen for a real model), gradient checkpointing on, DDP over 2 ranks in Axolotl's own
    environment, on 4-bit base weights (QLoRA, as on GPUs); the adapter saved to the given folder, reloaded
    with PEFT and scored."""
    nb, metrics = run_notebook("09_axolotl_olmo3", **_run_parameters("09_axolotl_olmo3", tmp_path))
    assert (tmp_path / "olmo3-lora" / "adapter_model.safetensors").is_file()
    assert metrics["processes"] == 2 and 0 <= metrics["accuracy_after"] <= 1
    out = stream_text(nb)
    assert "gradient_checkpointing: true" in out and "lora_modules_to_save: null" in out
    assert "adapter: qlora" in out and "load_in_4bit: true" in out and metrics["four_bit"] is True
    assert "trained 2 steps on 2 ranks" in out and "model in DistributedDataParallel" in out


@pytest.mark.notebook
def test_10_scale_up_10m_preset_resumed_on_1_and_4_ranks(run_notebook, tmp_path):
    """The 10M model with 8 micro-batches a step, every technique on it, the 2-rank checkpoint resumed on
    1 and on 4 CPU processes (world sizes other than the saving run's, here and on 8 GPUs); traces and
    checkpoint in the given output_dir."""
    nb, metrics = run_notebook("10_fast_and_elastic", **_run_parameters("10_fast_and_elastic", tmp_path))
    assert 9e6 < metrics["parameters"] < 12e6, metrics["parameters"]
    assert metrics["allreduces_per_step_naive"] == 8 * metrics["allreduces_per_step_no_sync"]
    assert metrics["resume_max_abs_diff"] < 1e-3
    assert "resumed on 1 rank(s)" in stream_text(nb) and "resumed on 4 rank(s)" in stream_text(nb)
    assert sorted(p.name for p in (tmp_path / "nb10" / "traces").iterdir()) == ["rank0.json", "rank1.json"]
    assert (tmp_path / "nb10" / "checkpoint" / "step_000001" / ".metadata").is_file()


@pytest.fixture
def ray_cluster(monkeypatch):
    """A Ray cluster started outside the notebook, found by `cluster="auto"` through RAY_ADDRESS."""
    from ray.cluster_utils import Cluster

    # Ray's test Cluster gives a node 150 MiB of object store (ray.init's default is 30% of the memory): the
    # 55,000 normalised images (172 MB) spilled to disk, and Ray started 6 more processes to spill and restore
    # them, which slowed the test's Ray Train cell; 1 GiB holds them
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False,
                                                            "object_store_memory": 1 << 30})
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.mark.notebook
def test_06_scale_up_on_a_ray_cluster(run_notebook, tmp_path, monkeypatch, ray_cluster):
    import mlflow

    monkeypatch.setenv("GALLERY_TRACKING", "on")
    params = _run_parameters("06_ray_train_resnet", tmp_path)
    nb, metrics = run_notebook("06_ray_train_resnet", **params)
    assert metrics["workers"] == 4 and metrics["recovered_from_failure"] is False
    assert (tmp_path / "ray-results" / "training").is_dir()    # Ray Train kept the run where it was told
    client = mlflow.tracking.MlflowClient(params["tracking_uri"])
    runs = client.search_runs([client.get_experiment_by_name("06_ray_train_resnet").experiment_id])
    assert len(runs) == 1 and runs[0].data.params["fail_at_epoch"] == "None"
    assert "train (55000, 28, 28), validation (5000, 28, 28), test (10000, 28, 28)" in stream_text(nb)
