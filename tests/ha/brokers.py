"""A three-node RabbitMQ cluster on this machine, from the broker's own binaries.

Each node has its own name (``relay-ha-<n>-<tag>@localhost``), AMQP and distribution
ports, configuration, data and log folders under one temporary folder, and the cluster's
own Erlang cookie (``HOME`` points the node and the CLI tools at it): the machine's own
broker (``rabbit@localhost`` on 5672, its cookie in ``/var/lib/rabbitmq``) is never
touched. Nodes 2 and 3 join node 1 with ``rabbitmqctl -n … join_cluster``.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
CTL_TIMEOUT_S = 120
START_TIMEOUT_S = 180


def mirror_policy(namespace: str) -> tuple[str, str]:
    """The policy (pattern, definition) that mirrors a namespace's classic queues —
    ``dispatch``, ``rows`` and the rate-limit grants — on every node (RabbitMQ 3.x)."""
    pattern = rf"^{re.escape(namespace)}\.(dispatch|rows|ratelimit\.grants\..+)$"
    return pattern, '{"ha-mode":"all","ha-sync-mode":"automatic"}'


@dataclass
class Node:
    """One broker node: its name, ports and folder."""

    name: str
    port: int
    dist_port: int
    home: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The node's AMQP address."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def pid(self) -> int | None:
        """The Erlang VM's process id (its pid file), once written."""
        path = self.home / "pid"
        text = path.read_text().strip() if path.exists() else ""
        return int(text) if text.isdigit() else None


@dataclass
class RabbitCluster:
    """Three clustered nodes under ``base`` (see the module doc)."""

    base: Path
    ports: list[tuple[int, int]]
    tag: str
    nodes: list[Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cookie_home = self.base / "erlang"
        for n, (port, dist) in enumerate(self.ports, start=1):
            name = f"relay-ha-{n}-{self.tag}@localhost"
            self.nodes.append(Node(name, port, dist, self.base / f"rabbit-{n}"))

    @property
    def amqp_url(self) -> str:
        """``RELAY_AMQP_URL`` for the cluster: every node's address, comma-separated."""
        return ",".join(node.url for node in self.nodes)

    def _env(self, node: Node | None = None) -> dict[str, str]:
        env = {**os.environ, "HOME": str(self.cookie_home), "ERL_EPMD_ADDRESS": "127.0.0.1"}
        env["RABBITMQ_CONF_ENV_FILE"] = str(self.base / "rabbitmq-env.conf")
        if node is not None:
            env |= {
                "RABBITMQ_NODENAME": node.name,
                "RABBITMQ_NODE_PORT": str(node.port),
                "RABBITMQ_DIST_PORT": str(node.dist_port),
                "RABBITMQ_CONFIG_FILE": str(node.home / "rabbitmq"),
                "RABBITMQ_MNESIA_BASE": str(node.home / "mnesia"),
                "RABBITMQ_LOG_BASE": str(node.home / "log"),
                "RABBITMQ_PID_FILE": str(node.home / "pid"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.base / "enabled_plugins"),
                "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            }
        return env

    def ctl(self, node: Node, *args: str, timeout: float = CTL_TIMEOUT_S) -> str:
        """Run ``rabbitmqctl -n <node> …``; its output, or an error with it."""
        done = subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node.name, *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {node.name} {' '.join(args)}: {done.stderr}")
        return done.stdout

    def prepare(self) -> None:
        """Write the cookie, the (empty) environment and plugin files, each node's config."""
        self.cookie_home.mkdir(parents=True)
        cookie = self.cookie_home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(20).upper())
        cookie.chmod(0o400)
        (self.base / "rabbitmq-env.conf").write_text("")
        (self.base / "enabled_plugins").write_text("[].\n")
        for node in self.nodes:
            for sub in ("mnesia", "log"):
                (node.home / sub).mkdir(parents=True)
            (node.home / "rabbitmq.conf").write_text(
                f"listeners.tcp.local = 127.0.0.1:{node.port}\nloopback_users = none\n"
            )

    def start_node(self, node: Node) -> None:
        """Start one node (its output in its folder); :meth:`await_node` waits for it."""
        (node.home / "pid").unlink(missing_ok=True)
        with open(node.home / "server.log", "ab") as out:
            node.process = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")],
                env=self._env(node),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def await_node(self, node: Node) -> None:
        """Wait until ``node`` has booted."""
        self.ctl(node, "wait", str(node.home / "pid"), "--timeout", str(START_TIMEOUT_S))

    def start(self) -> None:
        """Prepare, start the three nodes, cluster them."""
        self.prepare()
        for node in self.nodes:
            self.start_node(node)
        for node in self.nodes:
            self.await_node(node)
        first = self.nodes[0]
        for node in self.nodes[1:]:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", first.name)
            self.ctl(node, "start_app")
        running = self.ctl(first, "eval", "length(rabbit_nodes:all_running()).").strip()
        if running != str(len(self.nodes)):
            raise RuntimeError(f"the cluster runs {running} nodes, not {len(self.nodes)}")

    def set_mirroring(self, namespace: str) -> None:
        """Mirror the namespace's classic queues on every node (:func:`mirror_policy`)."""
        pattern, definition = mirror_policy(namespace)
        self.ctl(self.alive()[0], "set_policy", "--apply-to", "queues",
                 f"{namespace}-classic-ha", pattern, definition)  # fmt: skip

    def alive(self) -> list[Node]:
        """The nodes whose VM runs."""
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None]

    def node_named(self, name: str) -> Node:
        """The node called ``name``."""
        return next(node for node in self.nodes if node.name == name)

    def home_of(self, queue: str) -> Node:
        """The node holding a classic queue (its master, mirrored or not)."""
        for line in self.ctl(self.alive()[0], "-q", "list_queues", "name", "pid").splitlines():
            parts = line.split("\t")
            if parts[0] == queue:
                return self.node_named(_node_of_pid(parts[1]))
        raise RuntimeError(f"queue {queue} not found")

    def leader_of(self, queue: str) -> Node:
        """The node leading a quorum queue."""
        for line in self.ctl(self.alive()[0], "-q", "list_queues", "name", "leader").splitlines():
            parts = line.split("\t")
            if parts[0] == queue:
                return self.node_named(parts[1].strip())
        raise RuntimeError(f"queue {queue} not found")

    def kill(self, node: Node) -> None:
        """``kill -9`` the node's VM (and whatever it started) and reap it."""
        pid = node.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        if node.process is not None:
            try:
                os.killpg(node.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.process.wait(30)

    def restart(self, node: Node) -> None:
        """Start a killed node again and wait until it runs in the cluster again."""
        self.start_node(node)
        self.await_node(node)

    def synced(self, queue: str) -> bool:
        """True once every mirror of a classic queue is synchronised."""
        out = self.ctl(self.alive()[0], "-q", "list_queues", "name", "slave_pids",
                       "synchronised_slave_pids")  # fmt: skip
        for line in out.splitlines():
            parts = line.split("\t")
            if parts[0] == queue:
                return parts[1].count("<") == parts[2].count("<")
        return False

    def stop(self) -> None:
        """Stop every node: ``rabbitmqctl stop``, then ``kill -9`` what is left."""
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            try:
                self.ctl(node, "stop", timeout=60)
                node.process.wait(30)
            except (RuntimeError, subprocess.TimeoutExpired):
                self.kill(node)
        # The CLI's and the nodes' epmd registrations go with their VMs.
        time.sleep(0.5)


def _node_of_pid(pid: str) -> str:
    """``rabbit@host`` from a queue pid as ``rabbitmqctl`` prints it (``<node.1.2.3>``)."""
    inner = pid.strip().strip("<>")
    return inner.rsplit(".", 3)[0]
