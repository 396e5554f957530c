"""A real cluster on one machine, for the cluster test and for trying the cluster path before deploying it:
PostgreSQL (the Dagster instance), Redis (the Celery broker and result backend) and Celery workers, all on
127.0.0.1, all state under one directory.

    python -m synthkd_dev.local_cluster up   STATE_DIR [--workers 2] [--pin-workers]   # prints the env to source
    python -m synthkd_dev.local_cluster down STATE_DIR

Nothing here is used by a real deployment: there the services already exist and deploy/cluster/env.sh
points at them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from synthkd_assets.core.layout import DEFAULT_RAW_DIR
from synthkd_assets.defs.executors import (
    CELERY_CONFIG_ENV,
    DEFAULT_CELERY_CONFIG,
    EXECUTOR_ENV,
    REPO_ROOT,
    celery_config_path,
)
from synthkd_contract.settings import Settings

# Debian keeps the server tools off PATH, one directory per major version (newest first)
POSTGRES_BIN_DIRS = sorted(
    Path("/usr/lib/postgresql").glob("*/bin"),
    key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0,
    reverse=True,
)
CLUSTER_DAGSTER_YAML = REPO_ROOT / "deploy" / "cluster" / "dagster.yaml"
DATABASE = "dagster"


class ServiceError(RuntimeError):
    """A service did not start; the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bin(tool: str) -> Path | None:
    for d in POSTGRES_BIN_DIRS:
        if (d / tool).is_file():
            return d / tool
    found = shutil.which(tool)
    return Path(found) if found else None


def services_available() -> str | None:
    """None when PostgreSQL and Redis can be started here, else what is missing (for a skip reason)."""
    missing = [t for t in ("initdb", "pg_ctl") if postgres_bin(t) is None]
    missing += [t for t in ("redis-server",) if shutil.which(t) is None]
    return f"not installed: {', '.join(missing)} (.ci/run installs them with apt)" if missing else None


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else "(no log)"


def _wait_for(check, what: str, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise ServiceError(f"{what} did not come up within {timeout:.0f}s; log {log}:\n{_tail(log)}")


def _run(cmd: list[str], **kwargs) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise ServiceError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _as_postgres_user() -> dict:
    """PostgreSQL refuses to run as root: run its tools as the `postgres` account when we are root."""
    if os.geteuid() != 0:
        return {}
    account = pwd.getpwnam("postgres")
    return {"user": account.pw_uid, "group": account.pw_gid}


@dataclass
class LocalCluster:
    state_dir: Path
    raw_dir: Path  # absolute: workers and runs must agree on the roots whatever their working directory
    data_dir: Path
    celery_config: Path = DEFAULT_CELERY_CONFIG
    pg_port: int = field(default_factory=free_port)
    redis_port: int = field(default_factory=free_port)
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)
    _redis: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        while self.redis_port == self.pg_port:
            self.redis_port = free_port()

    @property
    def pg_data(self) -> Path:
        """Under STATE_DIR, except as root: then PostgreSQL runs as `postgres`, which may not traverse
        STATE_DIR's parents (pytest's are 0700), so its data lives in a directory of its own in /tmp."""
        if os.geteuid() != 0:
            return self.state_dir / "postgres"
        digest = hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"synthkd-postgres-{digest}"

    @property
    def dagster_home(self) -> Path:
        return self.state_dir / "dagster_home"

    def env(self) -> dict[str, str]:
        """What every process of the cluster build sees (deploy/cluster/env.sh, pointed at this machine)."""
        return {
            EXECUTOR_ENV: "celery",
            CELERY_CONFIG_ENV: str(self.celery_config),
            "SYNTHKD_CELERY_BROKER": f"redis://127.0.0.1:{self.redis_port}/0",
            "SYNTHKD_CELERY_BACKEND": f"redis://127.0.0.1:{self.redis_port}/1",
            "SYNTHKD_POSTGRES_URL": f"postgresql+psycopg2://postgres@127.0.0.1:{self.pg_port}/{DATABASE}",
            "SYNTHKD_MAX_CONCURRENT_RUNS": "2",
            "DAGSTER_HOME": str(self.dagster_home),
            "SYNTHKD_RAW_DIR": str(self.raw_dir),
            "SYNTHKD_DATA_DIR": str(self.data_dir),
        }

    def start_postgres(self) -> None:
        user = _as_postgres_user()
        self.pg_data.mkdir(parents=True, exist_ok=True)
        log = self.pg_data.parent / f"{self.pg_data.name}.log"
        log.touch()
        if user:
            for p in (self.pg_data, log):
                os.chown(p, user["user"], user["group"])
        if not (self.pg_data / "PG_VERSION").is_file():
            _run(
                [str(postgres_bin("initdb")), "-D", str(self.pg_data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                **user,
            )
        options = f"-p {self.pg_port} -c listen_addresses=127.0.0.1 -k {self.pg_data} -c fsync=off"
        _run(
            [str(postgres_bin("pg_ctl")), "-D", str(self.pg_data), "-l", str(log), "-o", options, "-w", "start"], **user
        )
        _wait_for(lambda: _port_open(self.pg_port), "PostgreSQL", log)
        psql = [str(postgres_bin("psql") or "psql"), "-h", "127.0.0.1", "-p", str(self.pg_port), "-U", "postgres"]
        exists = subprocess.run(
            [*psql, "-tAc", f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"], capture_output=True, text=True
        ).stdout.strip()
        if not exists:
            _run([*psql, "-c", f"CREATE DATABASE {DATABASE}"])

    def start_redis(self) -> None:
        log = self.state_dir / "redis.log"
        self._redis = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.state_dir),
                "--logfile",
                str(log),
            ],
            start_new_session=True,
        )
        _wait_for(lambda: _port_open(self.redis_port), "Redis", log)

    def write_instance_yaml(self) -> None:
        self.dagster_home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(CLUSTER_DAGSTER_YAML, self.dagster_home / "dagster.yaml")

    def start_worker(
        self, name: str, extra_env: dict[str, str] | None = None, cpus: set[int] | None = None
    ) -> subprocess.Popen:
        """One `dagster-celery worker start` with one pool process, in its own process group (so that
        kill_worker takes down the whole worker, as losing its machine would); `cpus`: the only cores it and
        every process and thread it starts may run on (a worker the size of a machine with those cores)."""
        log = self.state_dir / f"worker-{name}.log"
        env = {**os.environ, **self.env(), **(extra_env or {})}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # it execs `celery`
        cmd = [
            str(Path(sys.executable).parent / "dagster-celery"),
            "worker",
            "start",
            "-A",
            "dagster_celery.app",
            "-y",
            env[CELERY_CONFIG_ENV],
            "-n",
            name,
            "--",
            "--concurrency=1",
            f"--logfile={log}",
        ]
        with open(log.with_suffix(".err"), "w") as stderr:
            proc = subprocess.Popen(
                cmd,
                cwd=REPO_ROOT,
                env=env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
            )
        self.workers[name] = proc
        _wait_for(lambda: "ready." in _tail(log, 200) or proc.poll() is not None, f"Celery worker {name}", log, 120)
        if proc.poll() is not None:
            raise ServiceError(f"Celery worker {name} exited {proc.returncode}: {_tail(log.with_suffix('.err'))}")
        return proc

    def worker_log(self, name: str) -> Path:
        return self.state_dir / f"worker-{name}.log"

    def kill_worker(self, name: str) -> None:
        """SIGKILL the worker's whole process group: no warm shutdown, no chance to hand its step back."""
        proc = self.workers.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def up(self, workers: int = 2, pin_workers: bool = False) -> None:
        """PostgreSQL, Redis and `workers` Celery workers; `pin_workers`: worker i runs on core i only (of the
        cores this process may use, round robin), as if each were its own one-core machine."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.start_postgres()
        self.start_redis()
        self.write_instance_yaml()
        cores = sorted(os.sched_getaffinity(0))
        for i in range(workers):
            self.start_worker(f"worker{i + 1}", cpus={cores[i % len(cores)]} if pin_workers else None)

    def down(self) -> None:
        try:
            for name in list(self.workers):
                self.kill_worker(name)
            if self._redis is not None and self._redis.poll() is None:
                os.killpg(self._redis.pid, signal.SIGKILL)
                self._redis.wait()
        finally:
            if (self.pg_data / "postmaster.pid").is_file():
                subprocess.run(
                    [str(postgres_bin("pg_ctl")), "-D", str(self.pg_data), "-m", "immediate", "stop"],
                    capture_output=True,
                    **_as_postgres_user(),
                )
        if self.pg_data.parent != self.state_dir:
            shutil.rmtree(self.pg_data, ignore_errors=True)
            self.pg_data.with_name(f"{self.pg_data.name}.log").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m synthkd_dev.local_cluster")
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("state_dir", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--pin-workers", action="store_true", help="worker i on core i only: each worker like a one-core machine"
    )
    parser.add_argument("--raw-dir", type=Path, default=Path(Settings.read().raw_dir or REPO_ROOT / DEFAULT_RAW_DIR))
    parser.add_argument("--data-dir", type=Path, help="default: STATE_DIR/data")
    parser.add_argument("--celery-config", type=Path, default=celery_config_path(Settings.read()))
    args = parser.parse_args(argv)
    state = args.state_dir.resolve()
    ports = state / "ports.env"
    if args.command == "up":
        if missing := services_available():
            print(missing, file=sys.stderr)
            return 2
        cluster = LocalCluster(
            state, args.raw_dir.resolve(), (args.data_dir or state / "data").resolve(), args.celery_config.resolve()
        )
        try:
            cluster.up(args.workers, pin_workers=args.pin_workers)
        except BaseException:
            cluster.down()
            raise
        lines = [f"export {k}={v}" for k, v in cluster.env().items()]
        pids = [cluster._redis.pid, *(p.pid for p in cluster.workers.values())]
        lines.append(f"export SYNTHKD_LOCAL_CLUSTER_PIDS='{' '.join(str(pid) for pid in pids)}'")
        ports.write_text("\n".join(lines) + "\n")
        print(ports.read_text(), end="")
        print(f"# source {ports}", file=sys.stderr)
        return 0
    for line in ports.read_text().splitlines() if ports.is_file() else []:
        if line.startswith("export SYNTHKD_LOCAL_CLUSTER_PIDS="):
            for pid in line.split("=", 1)[1].strip("'").split():
                # only our own process groups: a pid from an old ports.env may belong to something else now
                cmdline = Path(f"/proc/{pid}/cmdline")
                if cmdline.is_file() and any(
                    k in cmdline.read_bytes() for k in (b"redis-server", b"dagster-celery", b"celery")
                ):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(int(pid), signal.SIGKILL)
    ports.unlink(missing_ok=True)
    LocalCluster(state, Path(), Path()).down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
