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
    monkeypatch.delenv("HELPERS_THREADS_PER_PROCESS", raising=False)
    assert cpus.usable_cpus() == 2
    assert cpus.threads_per_rank(2) == 1
    assert cpus.threads_per_rank(1) == 2


def test_affinity_mask_caps_the_count(tmp_path, monkeypatch):
    root = tmp_path / "cgroup"
    root.mkdir()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(cpus, "CGROUP_ROOT", root)
    monkeypatch.delenv("HELPERS_THREADS_PER_PROCESS", raising=False)
    assert cpus.usable_cpus() == 3
    assert cpus.threads_per_rank(2) == 1
    assert cpus.threads_per_rank(8) == 1


def test_threads_forced_by_environment(monkeypatch):
    monkeypatch.setenv("HELPERS_THREADS_PER_PROCESS", "4")
    assert cpus.threads_per_rank(2) == 4
    monkeypatch.setenv("HELPERS_THREADS_PER_PROCESS", "zero")
    with pytest.raises(ValueError, match="HELPERS_THREADS_PER_PROCESS='zero'"):
        cpus.threads_per_rank(2)


def test_bad_thread_setting_fails_before_any_process(monkeypatch):
    from helpers import LaunchError, distributed

    monkeypatch.setenv("HELPERS_THREADS_PER_PROCESS", "0")

    @distributed(processes=2, device="cpu", start_method="spawn")
    def never(x):
        raise AssertionError("a rank started")

    with pytest.raises(LaunchError, match="HELPERS_THREADS_PER_PROCESS"):
        never.distributed(1)
