"""Hosts on a network a test can cut silently: a router network namespace, N "host"
namespaces each joined to it by a veth pair, and a PostgreSQL cluster of the test's own that
the hosts reach through the router, as machines reach a database across a switch.

    with Topology.create(hosts=2) as net:
        dsn = net.dsn("postgres")                 # from a host: the database across the router
        admin = net.cluster.dsn("postgres")       # from the test itself: 127.0.0.1
        proc = net.popen(0, [sys.executable, "-m", "jobtui.cli", "worker", ...],
                         env={"JOBTUI_DSN": dsn})
        net.cut(0)                                # host 0's packets vanish, both ways
        ...
        net.heal(0)                               # and flow again

The layout, for a run of pid 4711 (every name starts with `jn4711` and a letter, so that two
runs, or two topologies of one run, never collide):

    root namespace                router namespace              host namespace i
    PostgreSQL on 127.0.0.1  ---  jn4711a-u0 | jn4711a-u1  ---  jn4711a-r<i> | jn4711a-h<i>
    and on 10.A.B.1 (uplink)      10.A.B.1/30  10.A.B.2/30      10.A.B.4i+5/30  10.A.B.4i+6/30

The root namespace is the database's host: the cluster listens on 127.0.0.1, where the test
reads it, and on the uplink's address, which is what the hosts connect to (`dsn`). A free
10.A.B.0/24 (A in 201-209) is routed in the root namespace through the router; nothing else of
the root namespace's network changes, and that route goes with the uplink.

`cut(i)` turns host i's routes in the router into blackhole routes, both ways: packets to the
host match a blackhole route of its address, and packets from it a rule sending them to a
table whose only route is a blackhole. A blackhole drops without an ICMP error or a reset, so
new connections time out and open sockets retransmit, as in a real partition (this kernel has
no netem). `heal(i)` removes them.

Everything made is removed by `close()` (the context manager's exit), whatever happened: the
processes left in the namespaces are killed, the namespaces and links deleted, the cluster
stopped. Leftovers of a run that was killed (its pid gone) are swept when the next topology is
made. Where namespaces cannot be made (not root, no iproute2, no PostgreSQL), `create` skips
the test, saying why. `python -m tests.netns` makes one with two hosts, prints how to reach
it, and removes it on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from jobtui.kernel.embedded import pid_alive

from .cluster import LocalCluster

_PREFIX = "jn"  # every name made here starts with it, then the pid, then a letter
_made = itertools.count()
# A table of the router's policy routing per host: its only route is a blackhole.
_TABLE_BASE = 100


class NetnsUnavailable(Exception):
    """Network namespaces cannot be made here (not root, no iproute2, refused)."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`ip ARGS`; RuntimeError naming the command and its error when it fails and `check`."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


def why_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can (by the look of it:
    `create` finds out for sure)."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install -y iproute2)"
    return None


@dataclass(frozen=True)
class Host:
    """One host namespace: its name, its address, and the router's side of its link."""

    index: int
    netns: str
    addr: str  # the host's own address, on its end of the veth pair
    gateway: str  # the router's address on the pair
    router_if: str  # the router's end of the pair


class Topology:
    """The router, the hosts and the cluster; see the module's docstring."""

    def __init__(self, prefix: str, subnet: str) -> None:
        self.prefix = prefix
        self.subnet = subnet  # "10.A.B": the /24 every address here is in
        self.router = f"{prefix}-router"
        self.db_addr = f"{subnet}.1"  # where hosts reach the cluster (the uplink's root end)
        self.hosts: list[Host] = []
        self.cluster: LocalCluster | None = None
        self._cut: set[int] = set()
        self._uplink = f"{prefix}-u0"
        self._made_netns: list[str] = []

    # -- making it -------------------------------------------------------------------------

    @classmethod
    def create(cls, hosts: int = 1, *, settings: Sequence[str] = ()) -> Topology:
        """The router, `hosts` host namespaces and a started cluster (with `settings` added
        to its postgresql.conf); skips the test when namespaces cannot be made here."""
        why = why_unavailable()
        if why is not None:
            pytest.skip(f"cannot make network namespaces: {why}")
        if not 1 <= hosts <= 60:
            raise ValueError(f"hosts: 1 to 60, got {hosts}")
        sweep_stale()
        try:
            net = cls._network(hosts)
        except NetnsUnavailable as exc:
            pytest.skip(f"cannot make network namespaces: {exc}")
        try:
            net.cluster = LocalCluster.create(
                settings=[f"listen_addresses = '127.0.0.1,{net.db_addr}'", *settings],
                hba=[f"host all all {net.subnet}.0/24 trust"],
            )
        except BaseException:
            net.close()
            raise
        return net

    @classmethod
    def _network(cls, hosts: int) -> Topology:
        prefix = f"{_PREFIX}{os.getpid()}{chr(ord('a') + next(_made) % 26)}"
        rng = random.Random(f"{prefix}{time.time_ns()}")
        for _ in range(40):
            net = cls(prefix, f"10.{rng.randrange(201, 210)}.{rng.randrange(0, 256)}")
            try:
                if net._build(hosts):
                    return net
            except BaseException:
                net.close()
                raise
            net.close()  # the subnet was taken meanwhile: another one
        raise NetnsUnavailable("no free 10.201-209.x.0/24 for the test's links")

    def _build(self, hosts: int) -> bool:
        """Make the router and its uplink, claim the subnet, then the hosts. False when the
        subnet is in use (nothing of this topology is left then but what close() removes)."""
        if _in_use(self.subnet):
            return False
        added = ip("netns", "add", self.router, check=False)
        if added.returncode != 0:
            raise NetnsUnavailable(added.stderr.strip() or "ip netns add failed")
        self._made_netns.append(self.router)
        router_uplink = f"{self.prefix}-u1"
        ip("link", "add", self._uplink, "type", "veth", "peer", "name", router_uplink, "netns", self.router)
        ip("addr", "add", f"{self.db_addr}/30", "dev", self._uplink)
        ip("link", "set", self._uplink, "up")
        r = ("-n", self.router)
        ip(*r, "addr", "add", f"{self.subnet}.2/30", "dev", router_uplink)
        ip(*r, "link", "set", router_uplink, "up")
        ip(*r, "link", "set", "lo", "up")
        ip(*r, "route", "add", "default", "via", self.db_addr)
        # The route of the whole /24 through the router is the claim on the subnet: a second
        # run that picked it too fails here ("File exists") and picks another.
        claimed = ip("route", "add", f"{self.subnet}.0/24", "via", f"{self.subnet}.2", "dev", self._uplink, check=False)
        if claimed.returncode != 0:
            return False
        _sysctl(self.router, "net.ipv4.ip_forward", "1")
        for i in range(hosts):
            self._add_host(i)
        return True

    def _add_host(self, i: int) -> None:
        host = Host(
            i,
            f"{self.prefix}-h{i}",
            addr=f"{self.subnet}.{4 * i + 6}",
            gateway=f"{self.subnet}.{4 * i + 5}",
            router_if=f"{self.prefix}-r{i}",
        )
        ip("netns", "add", host.netns)
        self._made_netns.append(host.netns)
        host_if = f"{self.prefix}-h{i}"
        ip(
            "-n",
            self.router,
            "link",
            "add",
            host.router_if,
            "type",
            "veth",
            "peer",
            "name",
            host_if,
            "netns",
            host.netns,
        )
        ip("-n", self.router, "addr", "add", f"{host.gateway}/30", "dev", host.router_if)
        ip("-n", self.router, "link", "set", host.router_if, "up")
        h = ("-n", host.netns)
        ip(*h, "addr", "add", f"{host.addr}/30", "dev", host_if)
        ip(*h, "link", "set", host_if, "up")
        ip(*h, "link", "set", "lo", "up")
        ip(*h, "route", "add", "default", "via", host.gateway)
        self.hosts.append(host)

    # -- using it --------------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", **params: str) -> str:
        """The cluster's DSN as the hosts reach it, across the router."""
        assert self.cluster is not None
        extra = "".join(f"&{k}={v}" for k, v in params.items())
        query = f"?{extra[1:]}" if extra else ""
        return f"postgresql://postgres@{self.db_addr}:{self.cluster.port}/{dbname}{query}"

    def exec_prefix(self, host: int) -> list[str]:
        """The command line's start that runs a program inside host `host`'s namespace."""
        return ["ip", "netns", "exec", self.hosts[host].netns]

    def popen(
        self, host: int, args: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Start `args` inside host `host` (in a session of its own; `close()` kills what is
        left of it); `env` is added to this process's environment."""
        return subprocess.Popen(
            [*self.exec_prefix(host), *args],
            env={**os.environ, **(env or {})},
            start_new_session=True,
            **kwargs,
        )

    def run(
        self, host: int, args: Sequence[str], *, timeout: float = 60, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run `args` inside host `host` to its end; its output as text."""
        return subprocess.run(
            [*self.exec_prefix(host), *args],
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def cut(self, host: int) -> None:
        """Drop every packet to and from host `host` in the router, silently."""
        h = self.hosts[host]
        r = ("-n", self.router)
        table = str(_TABLE_BASE + host)
        ip(*r, "route", "replace", "blackhole", "default", "table", table)
        ip(*r, "rule", "add", "iif", h.router_if, "lookup", table, "priority", table)
        ip(*r, "route", "add", "blackhole", f"{h.addr}/32")
        self._cut.add(host)

    def heal(self, host: int) -> None:
        """Let host `host`'s packets through again."""
        h = self.hosts[host]
        r = ("-n", self.router)
        table = str(_TABLE_BASE + host)
        ip(*r, "route", "del", "blackhole", f"{h.addr}/32", check=False)
        ip(*r, "rule", "del", "iif", h.router_if, "lookup", table, "priority", table, check=False)
        self._cut.discard(host)

    def is_cut(self, host: int) -> bool:
        return host in self._cut

    @contextlib.contextmanager
    def cut_off(self, host: int) -> Iterator[float]:
        """Host `host` cut off for the block; yields the monotonic time of the cut."""
        self.cut(host)
        try:
            yield time.monotonic()
        finally:
            self.heal(host)

    # -- removing it -----------------------------------------------------------------------

    def close(self) -> None:
        """Kill what runs in the namespaces, delete them and the uplink, stop the cluster."""
        for netns in reversed(self._made_netns):
            _kill_in(netns)
        for netns in reversed(self._made_netns):
            ip("netns", "del", netns, check=False)  # its links go with it (and their peers)
        self._made_netns.clear()
        ip("link", "del", self._uplink, check=False)  # with its route of the subnet
        self.hosts.clear()
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            cluster.close()

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sysctl(netns: str, key: str, value: str) -> None:
    done = subprocess.run(
        ["ip", "netns", "exec", netns, "sysctl", "-q", "-w", f"{key}={value}"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    if done.returncode != 0:
        raise NetnsUnavailable(f"cannot set {key} in the router: {done.stderr.strip()}")


def _in_use(subnet: str) -> bool:
    """Whether an address or a route of the root namespace is in `subnet`.0/24."""
    shown = ip("-o", "-4", "addr", "show").stdout + ip("-4", "route", "show").stdout
    return re.search(rf"\b{re.escape(subnet)}\.\d+", shown) is not None


def _kill_in(netns: str) -> None:
    for pid in ip("netns", "pids", netns, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(pid), signal.SIGKILL)


_OURS = re.compile(rf"^{_PREFIX}(\d+)[a-z]-")


def sweep_stale() -> list[str]:
    """Remove the namespaces and uplinks of runs whose process is gone (killed before it
    could clean up); the names removed."""
    if why_unavailable() is not None:
        return []
    removed = []
    names = [line.split()[0] for line in ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    links = re.findall(rf"^\d+: ({_PREFIX}\d+[a-z]-u0)[@:]", ip("-o", "link", "show", check=False).stdout, re.M)
    for name in [*names, *links]:
        match = _OURS.match(name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        if name in names:
            _kill_in(name)
            ip("netns", "del", name, check=False)
        else:
            ip("link", "del", name, check=False)
        removed.append(name)
    return removed


def main() -> None:
    with Topology.create(hosts=2) as net:
        assert net.cluster is not None
        print(f"router: {net.router}; database: {net.dsn()} (from the root namespace: {net.cluster.dsn()})")
        for h in net.hosts:
            print(f"host {h.index}: {' '.join(net.exec_prefix(h.index))} ... (address {h.addr})")
        print("Ctrl-C removes it all")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
