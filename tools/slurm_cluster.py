#!/usr/bin/env python3
"""A throwaway 2-node SLURM cluster with accounting on one Debian/Ubuntu machine, for checks and CI.

    python3 tools/slurm_cluster.py install  # only install the packages (apt-get), when missing
    python3 tools/slurm_cluster.py up       # install (if missing) and start it
    python3 tools/slurm_cluster.py status   # what runs, sinfo
    python3 tools/slurm_cluster.py exec -- sinfo           # run a command inside its network namespace
    python3 tools/slurm_cluster.py exec -- bash            # or a shell there (every SLURM command works in it)
    python3 tools/slurm_cluster.py down     # stop what `up` started, remove its config

What `up` starts, each by hand (no systemd), all inside a private network namespace that it creates and
keeps open with a holder process (`unshare --net sleep infinity`): munged (own key and socket), MariaDB
(data under the state folder, on 127.0.0.1:3306 of the namespace), slurmdbd (so `sacct` answers: Snakemake's
SLURM executor tracks jobs with it), slurmctld, and two slurmd on the one host (`slurmd -N n1`, `-N n2`,
each on its own port). The namespace has only a loopback device: nothing the cluster or its jobs do can
reach or be reached from another machine, its ports cannot clash with the host's, and torch's gloo finds
only loopback addresses to use. To run anything against the cluster, enter the namespace:

    nsenter --net=/proc/$(cat /tmp/lenbatch-slurm/netns.pid)/ns/net <command>

(`exec` does exactly that.) Every pid `up` starts is recorded with its start time in <dir>/pids.json;
`down` cancels the cluster's jobs, stops those pids (and nothing else: a pid reused by another process
has another start time), then any process still inside the namespace (job steps SLURM left), then the
holder, and removes /etc/slurm/slurm.conf and slurmdbd.conf.

Why /etc/slurm: Snakemake's SLURM executor drops SLURM_CONF from the environment of the `srun` it runs
inside each job, so that srun reads the default path. `up` refuses to replace a slurm.conf it did not
write (a real cluster's). It needs root (daemons, packages, /etc/slurm) and apt-get (to install), and
refuses in one line without them. Stdlib only: it runs before any venv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "mariadb-server"]
BINARIES = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "munged": "munge",
    "slurmdbd": "slurmdbd",
    "mariadbd": "mariadb-server",
}
ETC = Path(os.environ.get("LENBATCH_SLURM_ETC", "/etc/slurm"))
MARK = "# written by lenbatch tools/slurm_cluster.py; `tools/slurm_cluster.py down` removes it"
DEFAULT_DIR = Path(os.environ.get("LENBATCH_SLURM_DIR", "/tmp/lenbatch-slurm"))
NODES = {"n1": 17001, "n2": 17002}  # node name -> its slurmd's port (two slurmd on one host)
PARTITION = "debug"
CLUSTER = "lenbatch"
# Order of start; `down` stops in reverse.
DAEMONS = ["munged", "mariadb", "slurmdbd", "slurmctld", *(f"slurmd-{n}" for n in NODES)]


class Refused(SystemExit):
    """A one-line refusal (exit code 2)."""

    def __init__(self, message: str):
        print(f"slurm_cluster: {message}", file=sys.stderr)
        super().__init__(2)


# -- processes -------------------------------------------------------------------------------------------


def start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks after boot), None when no such process: with the pid
    it names one process, so a pid the system has since given to another process is never signalled."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _threads_running(pid: int) -> bool:
    """Whether any thread of ``pid`` has not exited. A multi-threaded daemon (slurmctld, slurmdbd, munged,
    mariadbd) whose main thread has ended shows its pid as a zombie while its other threads still shut down,
    seconds more: only when every thread is gone has the process exited."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    return True
        except (OSError, IndexError):
            continue
    return False


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status when it is this process's child (a daemon ``up`` started in this
    process), so that it leaves the process table now rather than when this process exits."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


def alive(entry: dict) -> bool:
    """Whether the process ``entry`` names (pid and start time) still runs: any of its threads not exited.
    A pid whose threads have all exited (a zombie its parent has not collected) counts as stopped."""
    st = start_time(entry["pid"])
    if st is None or st != entry["start"]:
        return False
    if _threads_running(entry["pid"]):
        return True
    _reap(entry["pid"])
    return False


# How long `down` waits for a daemon to exit after SIGTERM (then SIGKILL), and after SIGKILL (then it stops
# with an error naming the pid, rather than return while the daemon still runs)
GRACE_S = 10.0
KILL_WAIT_S = 20.0


class StillRunning(RuntimeError):
    """A process `down` stopped is still running after SIGKILL and :data:`KILL_WAIT_S` seconds."""


def stop(entry: dict, name: str, grace: float = GRACE_S, kill_wait: float = KILL_WAIT_S) -> None:
    """Stop the process ``entry`` names and return only once every thread of it has exited: SIGTERM, up to
    ``grace`` seconds, then SIGKILL and up to ``kill_wait`` seconds; :class:`StillRunning` naming the pid
    when it outlives that (a process in uninterruptible sleep, e.g. on a hung file system)."""
    if not alive(entry):
        return
    pid = entry["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if _wait_gone(entry, grace):
        return
    print(f"slurm_cluster: {name} (pid {pid}) still runs {grace:.0f} s after SIGTERM: SIGKILL", file=sys.stderr)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if not _wait_gone(entry, kill_wait):
        raise StillRunning(
            f"{name} (pid {pid}) still runs {kill_wait:.0f} s after SIGKILL (see its state: "
            f"cat /proc/{pid}/status); the cluster is not down: once it has exited, run "
            "`tools/slurm_cluster.py down` again before the next check"
        )


def _wait_gone(entry: dict, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(entry):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def netns_of(pid: int) -> str | None:
    """``pid``'s network namespace (``net:[<inode>]``), read from any of its threads that still runs (a
    zombie main thread has none); None when it has no running thread."""
    try:
        tids = [str(pid)] + [t for t in os.listdir(f"/proc/{pid}/task") if t != str(pid)]
    except OSError:
        return None
    for tid in tids:
        try:
            return os.readlink(f"/proc/{pid}/task/{tid}/ns/net")
        except OSError:
            continue
    return None


def processes_in(ns: str, exclude: tuple[int, ...] = ()) -> list[int]:
    """Pids of the processes with a running thread in network namespace ``ns`` (``net:[<inode>]``)."""
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and int(entry) not in exclude and netns_of(int(entry)) == ns
    ]


def in_namespace(holder: int) -> list[int]:
    """Pids of the processes inside the holder's network namespace, the holder excluded."""
    ns = netns_of(holder)
    return [] if ns is None else processes_in(ns, exclude=(holder, os.getpid()))


class Cluster:
    def __init__(self, root: Path):
        self.root = root.resolve()
        self.pids_file = self.root / "pids.json"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.db_socket = self.root / "mysql" / "mysqld.sock"
        self.host = socket.gethostname().split(".")[0]

    # state
    def pids(self) -> dict:
        try:
            return json.loads(self.pids_file.read_text())
        except (OSError, ValueError):
            return {}

    def record(self, name: str, pid: int) -> None:
        pids = self.pids()
        pids[name] = {"pid": pid, "start": start_time(pid)}
        self.pids_file.write_text(json.dumps(pids, indent=1))

    def netns(self) -> str | None:
        """The cluster's network namespace (``net:[<inode>]``) while it is up: after `down`, no process may
        be left in it (tests/slurm/)."""
        holder = self.holder()
        return None if holder is None else netns_of(holder)

    def holder(self) -> int | None:
        entry = self.pids().get("netns")
        return entry["pid"] if entry and alive(entry) else None

    def ns(self, *cmd: str) -> list[str]:
        holder = self.holder()
        if holder is None:
            raise Refused(f"no cluster is up under {self.root} (run `tools/slurm_cluster.py up`)")
        return ["nsenter", f"--net=/proc/{holder}/ns/net", *cmd]

    def spawn(self, name: str, cmd: list[str]) -> int:
        """Start ``cmd`` (a daemon in the foreground, so its pid is the one recorded) inside the namespace."""
        log = open(self.root / "logs" / f"{name}.out", "ab")
        proc = subprocess.Popen(
            self.ns(*cmd), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True
        )
        log.close()
        # nsenter execs the daemon (same pid); wait for that so the start time recorded is the daemon's
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if Path(f"/proc/{proc.pid}/exe").resolve().name != "nsenter":
                    break
            except OSError:
                break
            time.sleep(0.02)
        self.record(name, proc.pid)
        return proc.pid

    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.ns(*cmd), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        return proc

    def wait(self, what: str, ok, timeout: float = 60, daemon: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return
            if daemon and not alive(self.pids()[daemon]):
                raise RuntimeError(
                    f"{daemon} exited while waiting for {what}; its log: "
                    f"{self.root / 'logs'}/{daemon}.log and {daemon}.out"
                )
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}; logs in {self.root / 'logs'}")

    def port_open(self, port: int, host: str = "127.0.0.1") -> bool:
        code = f"import socket; socket.create_connection(({host!r}, {port}), timeout=1).close()"
        return self.run(sys.executable, "-c", code, check=False).returncode == 0

    # configuration
    def write_configs(self) -> None:
        cpus = os.cpu_count() or 1
        # each slurmd reports the one host's memory; leave room for both and the daemons
        mem_mb = max(1000, int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 / 2) - 500)
        r = self.root
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN"
            for n, port in NODES.items()
        )
        slurm_conf = f"""{MARK}
# State, logs and sockets live under {r}.
ClusterName={CLUSTER}
SlurmctldHost={self.host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire also holds a requeued job back this long before it may start again (default 120 s)
AuthInfo=socket={self.munge_socket},cred_expire=30
CredType=cred/munge
SlurmctldPort=6817
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/logs/slurmctld.log
SlurmdLogFile={r}/logs/slurmd-%n.log
# no cgroups here (a container): processes tracked through /proc, tasks not bound
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
# jobs leave the queue at once, so the executor's status checks see their end promptly
MinJobAge=60
# sacct: slurmdbd, authenticated through this cluster's munge socket; the job's comment carries
# Snakemake's rule name (the job name is a run id)
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStoragePass={self.munge_socket}
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
{nodes}
PartitionName={PARTITION} Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""
        dbd_conf = f"""{MARK}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
DbdHost={self.host}
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
PidFile={r}/slurmdbd.pid
LogFile={r}/logs/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=lenbatch
StorageLoc=slurm_acct_db
"""
        ETC.mkdir(parents=True, exist_ok=True)
        for name, text in (("slurm.conf", slurm_conf), ("slurmdbd.conf", dbd_conf)):
            path = ETC / name
            path.write_text(text)
            path.chmod(0o600 if name == "slurmdbd.conf" else 0o644)  # slurmdbd refuses a readable one

    # commands
    def up(self) -> None:
        if self.holder() is not None:
            raise Refused(f"a cluster is already up under {self.root} (`tools/slurm_cluster.py down` first)")
        for name in ("slurm.conf", "slurmdbd.conf"):
            path = ETC / name
            if path.exists() and MARK not in path.read_text(errors="replace"):
                raise Refused(
                    f"{path} exists and was not written by this script (a real cluster's?): "
                    f"refusing to replace it; move it away or use another machine"
                )
        install()
        if self.root.exists():
            shutil.rmtree(self.root)
        for sub in ("logs", "state", "munge", "mysql", "db", *(f"spool/{n}" for n in NODES)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        try:
            self._up()
        except BaseException:
            print(f"slurm_cluster: start failed; stopping what started (logs: {self.root / 'logs'})", file=sys.stderr)
            self.down(quiet=True)
            raise

    def _up(self) -> None:
        r = self.root
        t0 = time.monotonic()
        # no inherited stdout: a caller reading `up`'s output (a pipe, capture_output) would wait for the
        # holder to close it, i.e. until `down`
        holder = subprocess.Popen(
            ["unshare", "--net", "sleep", "infinity"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.wait(
            "the network namespace",
            lambda: (
                Path(f"/proc/{holder.pid}/exe").resolve().name == "sleep"
                if Path(f"/proc/{holder.pid}").exists()
                else False
            ),
            timeout=10,
        )
        self.record("netns", holder.pid)
        (r / "netns.pid").write_text(f"{holder.pid}\n")
        self.run("ip", "link", "set", "lo", "up")
        # slurmdbd binds its port through getaddrinfo(NULL, AI_ADDRCONFIG), which counts no address of
        # 127.0.0.1's: a second loopback address gives it one
        self.run("ip", "addr", "add", "127.0.0.2/8", "dev", "lo")
        self.write_configs()

        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={r}/munge/munged.pid",
                f"--log-file={r}/logs/munged.log",
                f"--seed-file={r}/munge/munged.seed",
            ],
        )
        self.wait("munged's socket", self.munge_socket.exists, daemon="munged")

        install_db = subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={r}/db",
                "--user=root",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if install_db.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {install_db.stdout}{install_db.stderr}")
        self.spawn(
            "mariadb",
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={r}/db",
                f"--socket={self.db_socket}",
                "--bind-address=127.0.0.1",
                "--port=3306",
                "--user=root",
                "--skip-name-resolve",
                f"--pid-file={r}/mysql/mariadb.pid",
                f"--log-error={r}/logs/mariadb.log",
                "--innodb-buffer-pool-size=64M",
                "--innodb-log-file-size=48M",
            ],
        )
        self.wait("MariaDB's socket", self.db_socket.exists, daemon="mariadb")
        sql = (
            "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'lenbatch'; "
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
        )
        self.wait(
            "MariaDB to take SQL",
            lambda: (
                self.run(
                    "mariadb", "--no-defaults", f"--socket={self.db_socket}", "-uroot", "-e", sql, check=False
                ).returncode
                == 0
            ),
            daemon="mariadb",
        )

        self.spawn("slurmdbd", ["slurmdbd", "-D"])
        self.wait("slurmdbd's port 6819", lambda: self.port_open(6819), daemon="slurmdbd")
        self.spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self.wait("slurmctld's port 6817", lambda: self.port_open(6817), daemon="slurmctld")
        for n in NODES:
            self.spawn(f"slurmd-{n}", ["slurmd", "-D", "-N", n])

        def nodes_idle():
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
            states = dict(zip(out[::2], out[1::2]))
            return all(states.get(n) == "idle" for n in NODES)

        self.wait("both nodes idle in sinfo", nodes_idle, timeout=60)
        # the cluster registers itself with slurmdbd; root's association lets sacct list its jobs by user
        self.wait(
            "the cluster in the accounting database",
            lambda: (
                CLUSTER
                in self.run("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster", check=False).stdout.split()
            ),
            timeout=30,
        )
        print(
            f"slurm_cluster: up in {time.monotonic() - t0:.1f} s: nodes {', '.join(NODES)}, partition "
            f"{PARTITION}, accounting on; enter it with: nsenter --net=/proc/{holder.pid}/ns/net <command> "
            f"(or tools/slurm_cluster.py exec -- <command>)"
        )

    def down(self, quiet: bool = False) -> None:
        pids = self.pids()
        holder = self.holder()
        if holder is not None and "slurmctld" in pids and alive(pids["slurmctld"]):
            # a job's processes are slurmstepd's, not slurmd's: cancel them while the cluster can
            self.run("scancel", "--full", "--state=RUNNING,PENDING,SUSPENDED,REQUEUED", "-u", "root", check=False)
            self.run("scancel", "--full", "-u", "root", check=False)
        # every process is stopped even when one outlives its SIGKILL; those are named together at the end
        still: list[str] = []

        def stop_one(entry: dict, name: str, **kw) -> None:
            try:
                stop(entry, name, **kw)
            except StillRunning as err:
                still.append(str(err))

        for name in reversed(DAEMONS):
            if name in pids:
                stop_one(pids[name], name)
        if holder is not None:
            # what SLURM left (a job step it did not clean up, slurmctld's slurmscriptd, a shell someone
            # opened with `exec`) is inside the namespace, so it is this cluster's: stop it, then the holder
            for pid in in_namespace(holder):
                entry = {"pid": pid, "start": start_time(pid)}
                if entry["start"] is not None and alive(entry):
                    print(f"slurm_cluster: stopping pid {pid} left inside the cluster's namespace", file=sys.stderr)
                    stop_one(entry, f"pid {pid} (in the cluster's namespace)", grace=5)
        if "netns" in pids:
            stop_one(pids["netns"], "netns holder")
        if still:
            # pids.json stays, so `down` can be run again once they have exited
            raise StillRunning("; ".join(still))
        for name in ("slurm.conf", "slurmdbd.conf"):
            path = ETC / name
            if path.exists() and MARK in path.read_text(errors="replace"):
                path.unlink()
        self.pids_file.unlink(missing_ok=True)
        if not quiet:
            print("slurm_cluster: down" if pids else f"slurm_cluster: nothing was up under {self.root}")

    def status(self) -> int:
        pids = self.pids()
        if not pids:
            print(f"slurm_cluster: not up (no {self.pids_file})")
            return 1
        ok = True
        for name in ["netns", *DAEMONS]:
            if name in pids:
                up = alive(pids[name])
                ok &= up
                print(f"{name:12s} pid {pids[name]['pid']:>7d}  {'running' if up else 'STOPPED'}")
        if self.holder() is not None:
            print(self.run("sinfo", "-N", "-l", check=False).stdout.rstrip())
        return 0 if ok else 1


def install() -> None:
    """Install the Debian packages whose programs are missing (one apt-get call); refuse without root/apt."""
    missing = sorted(
        {pkg for binary, pkg in BINARIES.items() if not (shutil.which(binary) or Path("/usr/sbin", binary).exists())}
    )
    if not missing:
        return
    if os.geteuid() != 0:
        raise Refused(f"needs root to install {' '.join(missing)} (and to start SLURM's daemons): run it as root")
    if shutil.which("apt-get") is None:
        raise Refused(f"needs apt-get to install {' '.join(missing)} (Debian/Ubuntu); install them by hand")
    print(f"slurm_cluster: installing {' '.join(PACKAGES)} with apt-get", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # the packages' scripts must not start daemons (no systemd here; this script starts its own)
    policy = Path("/usr/sbin/policy-rc.d")
    wrote_policy = not policy.exists()
    if wrote_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        for cmd in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
        ):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(
                    f"slurm_cluster: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}"
                    f"{proc.stderr[-2000:]}"
                )
    finally:
        if wrote_policy:
            policy.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_DIR,
        help=f"state folder: pids, logs, sockets, the database (default {DEFAULT_DIR})",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", help="install if missing, start the cluster")
    inst = sub.add_parser("install", help="install the Debian packages when missing")
    inst.add_argument(
        "--if-possible",
        action="store_true",
        help="without root or apt-get, say so in one line and exit 0 (make test-deps on a laptop)",
    )
    sub.add_parser("down", help="stop what `up` started")
    sub.add_parser("status", help="the recorded daemons and sinfo")
    ex = sub.add_parser("exec", help="run a command inside the cluster's network namespace")
    ex.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cluster = Cluster(args.dir)
    if args.cmd == "up":
        if os.geteuid() != 0:
            raise Refused("needs root (it starts SLURM's daemons and writes /etc/slurm/slurm.conf): run it as root")
        cluster.up()
    elif args.cmd == "install":
        try:
            install()
        except Refused:
            if not args.if_possible:
                raise
            print(
                "slurm_cluster: not installing SLURM here (see above); the SLURM check will be skipped", file=sys.stderr
            )
    elif args.cmd == "down":
        try:
            cluster.down()
        except StillRunning as err:
            print(f"slurm_cluster: {err}", file=sys.stderr)
            return 1
    elif args.cmd == "status":
        return cluster.status()
    else:
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("exec: give a command, e.g. `exec -- sinfo`")
        return subprocess.call(cluster.ns(*command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
