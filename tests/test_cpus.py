"""The CPUs a launch shares out: the affinity mask and the container's quota, not the host's count."""

import os

import pytest

from helpers import cpus


def _proc_cgroup(tmp_path, text):
    path = tmp_path / "proc-self-cgroup"
    path.write_text(text)
    return path


def test_cgroup_v2_quota_of_own_group_and_parents(tmp_path):
    root = tmp_path / "cgroup"
    (root / "kubepods" / "pod1").mkdir(parents=True)
    (root / "cpu.max").write_text("max 100000\n")
    (root / "kubepods" / "cpu.max").write_text("400000 100000\n")          # 4 CPUs for the pods
    (root / "kubepods" / "pod1" / "cpu.max").write_text("150000 100000\n")  # 1.5 for this one
    proc = _proc_cgroup(tmp_path, "0::/kubepods/pod1\n")
    assert cpus.cpu_quota(root, proc) == pytest.approx(1.5)
    assert cpus.usable_cpus(root, proc) == min(len(os.sched_getaffinity(0)), 2)


def test_cgroup_v2_without_quota(tmp_path):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cpu.max").write_text("max 100000\n")
    proc = _proc_cgroup(tmp_path, "0::/\n")
    assert cpus.cpu_quota(root, proc) is None
    assert cpus.usable_cpus(root, proc) == len(os.sched_getaffinity(0))


def test_cgroup_v1_quota(tmp_path):
    root = tmp_path / "cgroup"
    folder = root / "cpu,cpuacct" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("200000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    proc = _proc_cgroup(tmp_path, "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n")
    assert cpus.cpu_quota(root, proc) == pytest.approx(2.0)


def test_cgroup_v1_unlimited(tmp_path):
    root = tmp_path / "cgroup"
    (root / "cpu").mkdir(parents=True)
    (root / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    proc = _proc_cgroup(tmp_path, "2:cpu:/\n")
    assert cpus.cpu_quota(root, proc) is None


def test_a_two_cpu_container_on_a_big_host_gets_one_thread_per_rank(tmp_path, monkeypatch):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cpu.max").write_text("200000 100000\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(cpus, "CGROUP_ROOT", root)
    monkeypatch.delenv("GALLERY_THREADS_PER_PROCESS", raising=False)
    assert cpus.usable_cpus() == 2
    assert cpus.threads_per_rank(2) == 1
    assert cpus.threads_per_rank(1) == 2


def test_affinity_mask_caps_the_count(tmp_path, monkeypatch):
    root = tmp_path / "cgroup"
    root.mkdir()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(cpus, "CGROUP_ROOT", root)
    monkeypatch.delenv("GALLERY_THREADS_PER_PROCESS", raising=False)
    assert cpus.usable_cpus() == 3
    assert cpus.threads_per_rank(2) == 1
    assert cpus.threads_per_rank(8) == 1


def test_threads_forced_by_environment(monkeypatch):
    monkeypatch.setenv("GALLERY_THREADS_PER_PROCESS", "4")
    assert cpus.threads_per_rank(2) == 4
    monkeypatch.setenv("GALLERY_THREADS_PER_PROCESS", "zero")
    with pytest.raises(ValueError, match="GALLERY_THREADS_PER_PROCESS='zero'"):
        cpus.threads_per_rank(2)


def test_bad_thread_setting_fails_before_any_process(monkeypatch):
    from helpers import LaunchError, distributed

    monkeypatch.setenv("GALLERY_THREADS_PER_PROCESS", "0")

    @distributed(processes=2, device="cpu", start_method="spawn")
    def never(x):
        raise AssertionError("a rank started")

    with pytest.raises(LaunchError, match="GALLERY_THREADS_PER_PROCESS"):
        never.distributed(1)


@pytest.fixture
def torch_threads():
    """The test may change this process's torch thread count; it is put back."""
    import torch

    saved = torch.get_num_threads()
    yield torch
    torch.set_num_threads(saved)


def _quota_of_one_cpu(tmp_path, monkeypatch):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cpu.max").write_text("100000 100000\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    return root


def test_the_kernels_torch_threads_are_fitted_to_the_quota(tmp_path, monkeypatch, torch_threads):
    """torch counts the affinity mask (8 here) and not the quota (1 CPU): import helpers lowers it."""
    root = _quota_of_one_cpu(tmp_path, monkeypatch)
    torch_threads.set_num_threads(8)
    assert cpus.fit_torch_threads(root) == 1
    assert torch_threads.get_num_threads() == 1
    assert cpus.fit_torch_threads(root) is None      # already within the quota: nothing to do


def test_threads_the_user_set_are_kept(tmp_path, monkeypatch, torch_threads):
    root = _quota_of_one_cpu(tmp_path, monkeypatch)
    torch_threads.set_num_threads(3)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpus.fit_torch_threads(root) is None
    assert torch_threads.get_num_threads() == 3


def test_import_helpers_fits_the_threads_in_a_real_quota():
    """A new interpreter in a real 1-CPU cgroup: torch counts 2+ CPUs; importing the launcher fits it."""
    import subprocess
    import sys

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs or more")
    from tests.support import join, one_cpu_cgroup

    group = one_cpu_cgroup()
    if group is None:
        pytest.skip("cannot make a cgroup here (needs root and a writable cpu controller)")
    code = ("import torch; before = torch.get_num_threads(); import helpers.launch; "
            "print(before, torch.get_num_threads())")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                             text=True, preexec_fn=lambda: join(group))
    except subprocess.SubprocessError as error:   # the kernel refused the move (cgroup v2's rules)
        if "preexec_fn" not in str(error):
            raise
        pytest.skip(f"cannot join the cgroup made here: {error}")
    finally:
        group.rmdir()
    before, after = map(int, out.stdout.split())
    assert before >= 2 and after == 1, f"torch threads {before} before import helpers, {after} after"
