"""A private Ray instance leaves no process behind, even one that renamed itself and lost its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from helpers.launch import ray_instance as ray_backend

# A stand-in for a Ray worker: its command line does not name the instance's folder (Ray workers rename
# themselves "ray::TrainController"), but its output goes to a log file there, as a Ray worker's does.
WORKER = "import os, time; log = open(os.environ['LOG'], 'w'); print('ready', flush=True); time.sleep(120)"


def test_a_renamed_worker_of_the_instance_is_found_and_stopped(tmp_path):
    folder = tmp_path / "ray-instance"
    (folder / "logs").mkdir(parents=True)
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, LOG=str(folder / "logs" / "worker.out")))
    try:
        assert worker.stdout.readline() == "ready\n"
        assert worker.pid in ray_backend._ray_processes(str(folder))
        assert worker.pid not in ray_backend._ray_processes(str(tmp_path / "another-instance"))
        ray_backend._wait_for_ray_processes(str(folder), timeout=0.5)
        assert worker.wait(timeout=10) == -signal.SIGKILL
    finally:
        if worker.poll() is None:
            worker.kill()


def test_ray_data_logging_config_quiets_info_and_keeps_errors(tmp_path, capsys):
    """The config ray_session gives Ray Data: read as Ray Data reads it, INFO dropped, errors still shown."""
    import logging
    import logging.config

    import yaml

    path = ray_backend._ray_data_logging_config(str(tmp_path), "ERROR")
    config = yaml.safe_load(open(path))   # how ray.data._internal.logging loads RAY_DATA_LOGGING_CONFIG
    logging.config.dictConfig(config)
    logger = logging.getLogger("ray.data._internal.execution.streaming_executor")
    try:
        logger.info("Starting execution of Dataset train_0. Full logs are in /tmp/ray-x/logs/ray-data")
        logger.error("a real failure")
        err = capsys.readouterr().err
        assert "Starting execution" not in err
        assert "a real failure" in err
    finally:
        logging.getLogger("ray.data").handlers.clear()
        logging.getLogger("ray.data").propagate = True
        logging.getLogger("ray.data").setLevel(logging.NOTSET)


def test_a_refused_token_is_named_with_its_fix():
    """Ray's Python error only says it could not connect; the refusal of a missing token is on the C++
    client's stderr, and the launcher's message must name it (seen by hand against `ray start --head` with
    RAY_AUTH_MODE=token, connecting from a process without the token)."""
    from helpers.launch.ray_instance import connect_failure

    refused = ("[2026-01-01 00:00:00,000 W 1 1] gcs_client.cc:210: Failed to get cluster ID from GCS server: "
               "Unauthenticated: RPC error: InvalidAuthToken: Authentication token is missing or incorrect\n")
    error = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    message = connect_failure("auto", error, refused)
    assert "RAY_AUTH_MODE=token" in message and "RAY_AUTH_TOKEN" in message and "docs/cluster.md" in message
    plain = connect_failure("auto", error, "")
    assert "RAY_AUTH_MODE" not in plain and "ray start --head" in plain
