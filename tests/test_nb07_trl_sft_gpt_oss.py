"""Notebook 07 under papermill with parameters other than the stored defaults.

The stored notebook (FSDP, full fine-tuning, 2 processes, with the DDP-vs-FSDP parity runs) is executed by
nbval, with its learning bar and reference run. This file runs the other strategy and the other kind of
training, DDP with LoRA on 1 process, for a few steps (`max_steps`): the LoRA checks (a gradient in every
adapter matrix, moved expert adapters) and the adapter's save / reload / evaluation hold at any size. The
120B-shaped FSDP + LoRA command runs in tests/test_scale_up.py, on an MXFP4 stand-in. And the bad settings
that must fail before any launch.
"""

import pytest

from tests.conftest import stream_text

pytestmark = pytest.mark.notebook


def test_ddp_lora_one_process(run_notebook):
    nb, metrics = run_notebook("07_trl_sft_gpt_oss", strategy="ddp", peft="lora", processes=1, n_test=16,
                               max_steps=6, run_parity=False)
    assert metrics["strategy"] == "ddp" and metrics["peft"] == "lora" and metrics["processes"] == 1
    out = stream_text(nb)
    assert "DDP fine-tuning: 6 steps" in out
    assert "adapter matrices received a gradient; the 8 expert adapter matrices changed" in out
    assert "saved adapter: ['adapter_config.json', 'adapter_model.safetensors']" in out


@pytest.mark.parametrize("bad, message", [
    ({"strategy": "zero3"}, "strategy='zero3': use 'ddp'"),
    ({"lora_target_parameters": ["mlp.experts.up_proj"]}, "'mlp.experts.up_proj' matches no parameter"),
    ({"lora_target_modules": ["qkv_proj"]}, r"lora_target_modules=\['qkv_proj'\] matches nothing"),
])
def test_bad_settings_fail_before_launch(run_notebook, bad, message):
    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError, match=message) as info:
        run_notebook("07_trl_sft_gpt_oss", **bad)
    assert "[rank" not in str(info.value)  # nothing was launched


def test_a_model_folder_without_tokenizer_fails_before_launch(run_notebook, tmp_path):
    from papermill.exceptions import PapermillExecutionError

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(PapermillExecutionError, match="holds a model but no tokenizer") as info:
        run_notebook("07_trl_sft_gpt_oss", model_name=str(tmp_path / "model"))
    assert "[rank" not in str(info.value)
