"""Podman on this machine for ``make container-check``: the tools, a configuration of our
own, a Debian base image built locally, the project's image, and a runner.

What it took to run podman 4.3 as root here, and so what this module sets up:

- ``runc``, not ``crun``: the cgroups are mounted in hybrid (v1) mode, and crun's
  ``setrlimit`` of the default limits is refused.
- default ulimits within the host's own hard limits (``containers.conf``): podman asks for
  ``nofile=1048576`` and a large ``nproc`` otherwise, and raising a hard limit needs
  ``CAP_SYS_RESOURCE``, which root does not have in this sandbox; runc sets them on the
  container's first process from outside, where ``nproc`` above 32768 is refused too.
- the host's CA bundle and a ``pip.conf`` naming it, mounted into the build (never into
  the image), so that pip reaches the package index through this network's TLS proxy.
- the base image: no container registry is reachable, so a Debian bookworm root with its
  Python 3.11 is made by ``mmdebstrap`` and imported; ``python-is-python3`` gives the
  ``python`` the Dockerfile calls, ``passwd`` its ``groupadd``/``useradd``.

The configuration lives in a directory of the run (``CONTAINERS_CONF``); nothing under
/etc/containers is changed. Images are kept between runs (the base and the build cache
make a warm run fast); every container, pod, volume and secret is the caller's to remove.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path

APT_PACKAGES = ("podman", "runc", "mmdebstrap")
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "passwd")
# Left out of the base to keep it small: nothing at run time reads them.
BASE_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")
# runc refuses a container's RLIMIT_NPROC above this here (see the module docstring).
NPROC_CAP = 32768
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class PodmanError(AssertionError):
    """A podman (or tool) command failed; the message has its output."""


def missing_tools() -> list[str]:
    """The apt packages of :data:`APT_PACKAGES` whose command is not installed."""
    # runc lives in /usr/sbin, which a cron job's or CI runner's PATH may lack.
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
    return [name for name in APT_PACKAGES if shutil.which(name, path=path) is None]


def install_tools(packages: list[str], log: Path) -> None:
    """``apt-get install`` ``packages`` (root), output to ``log``."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with log.open("ab") as out:
        for argv in (
            ["apt-get", "update", "-qq"],
            # With podman's recommends: catatonit, the init of the pods' infra container.
            ["apt-get", "install", "-y", "-qq", *packages],
        ):
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
            if done.returncode != 0:
                raise PodmanError(f"{' '.join(argv)} failed (exit {done.returncode}); see {log}")
    if still := missing_tools():
        raise PodmanError(f"still missing after apt-get install: {still}")


def _ulimits() -> list[str]:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else min(nofile, 1048576)
    nproc = NPROC_CAP if nproc == resource.RLIM_INFINITY else min(nproc, NPROC_CAP)
    return [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]


class Podman:
    """``podman`` with this run's configuration; every call is logged to ``log``."""

    def __init__(self, workdir: Path, log: Path) -> None:
        self.workdir = workdir
        self.log = log
        conf = workdir / "containers.conf"
        conf.write_text(
            "[containers]\n"
            f"default_ulimits = {json.dumps(_ulimits())}\n"
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
        )
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def run(
        self, *args: str, timeout: float = 120, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``podman args``; raise :class:`PodmanError` on a non-zero exit if ``check``."""
        done = subprocess.run(
            ["podman", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )
        with self.log.open("a") as out:
            out.write(
                f"$ podman {' '.join(args)}\n-> {done.returncode}\n{done.stdout}{done.stderr}\n"
            )
        if check and done.returncode != 0:
            raise PodmanError(f"podman {' '.join(args[:3])}… exit {done.returncode}: {done.stderr}")
        return done

    def out(self, *args: str, timeout: float = 120) -> str:
        """The stripped standard output of a successful ``podman args``."""
        return self.run(*args, timeout=timeout).stdout.strip()

    def runtime(self) -> str:
        """The OCI runtime podman uses with this configuration."""
        return self.out("info", "--format", "{{.Host.OCIRuntime.Name}}")

    def image_exists(self, ref: str) -> bool:
        """True when ``ref`` is in local storage."""
        return self.run("image", "exists", ref, check=False).returncode == 0

    def image_size(self, ref: str) -> int:
        """The image's size in bytes."""
        return int(self.out("image", "inspect", "--format", "{{.Size}}", ref))


def base_tag() -> str:
    """The local base image's tag: it changes with what goes into it."""
    recipe = json.dumps([BASE_SUITE, BASE_PACKAGES, BASE_EXCLUDES]).encode()
    return f"localhost/relay-base:{BASE_SUITE}-py311-{hashlib.sha256(recipe).hexdigest()[:12]}"


def build_base(podman: Podman, tag: str, log: Path) -> None:
    """Make a Debian root with ``mmdebstrap`` and import it as ``tag``."""
    with tempfile.TemporaryDirectory(dir=podman.workdir) as tmp:
        tarball = Path(tmp) / "base.tar"
        argv = [
            "mmdebstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            *(f"--dpkgopt=path-exclude={pattern}" for pattern in BASE_EXCLUDES),
            BASE_SUITE,
            str(tarball),
        ]
        with log.open("ab") as out:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            raise PodmanError(f"mmdebstrap failed (exit {done.returncode}); see {log}")
        podman.run("import", "--change", 'CMD ["python3"]', str(tarball), tag, timeout=300)


def build_image(podman: Podman, root: Path, base: str, tag: str) -> str:
    """Build ``deploy/docker/Dockerfile`` from ``root`` on ``base`` as ``tag``; return the
    built image's id (what ``tag`` named when the build ended).

    The build runs on the host's network with the host's CA bundle and a ``pip.conf``
    naming it mounted in: mounts are not part of any layer.
    """
    pip_conf = podman.workdir / "pip.conf"
    pip_conf.write_text(f"[global]\ncert = {HOST_CA_BUNDLE}\n")
    pip_conf.chmod(0o644)
    podman.run(
        "build",
        "--network",
        "host",
        "--volume",
        f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro",
        "--volume",
        f"{pip_conf}:/etc/pip.conf:ro",
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        "--file",
        str(root / "deploy" / "docker" / "Dockerfile"),
        "--tag",
        tag,
        "--iidfile",
        str(podman.workdir / "image.id"),
        str(root),
        timeout=900,
    )
    return (podman.workdir / "image.id").read_text().strip()
