"""Static sanity of deploy/docker/Dockerfile and .dockerignore (no Docker engine here).

Checks in the spirit of hadolint: multi-stage on a pinned slim base, runs as a numeric
non-root user, exec-form command naming a real console script, nothing secret baked in,
the build context admits only what the image copies, dependencies come only from the
hashed lock, and the deployment page's `docker run` example carries what a service needs to start.
``make container-check`` builds and runs the image for real.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import tomllib

from relay_batches.router.aliases import load_aliases
from tests.deploy.manifests import DEPLOY, ROOT, console_scripts, render

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
SECRET_WORDS = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|PRIVATE", re.IGNORECASE)
DEPLOYMENT_DOC = ROOT / "docs" / "operations" / "deployment.md"


def _instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined and comments dropped."""
    joined: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    assert pending == "", "dangling line continuation"
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined]


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last_from:]


def test_it_is_multi_stage_on_a_pinned_slim_python_base() -> None:
    stages = [args for op, args in _instructions() if op == "FROM"]
    assert len(stages) >= 2
    assert all(" AS " in s.upper() for s in stages)
    (base,) = {args.split("=", 1)[1] for op, args in _instructions() if op == "ARG"}
    assert re.fullmatch(r"python:3\.11-slim-\w+", base)
    assert not any("latest" in s for s in stages)
    copies = [args for op, args in _final_stage() if op == "COPY"]
    assert any(c.startswith("--from=build ") for c in copies)


def test_the_final_stage_runs_as_a_numeric_non_root_user() -> None:
    users = [args for op, args in _final_stage() if op == "USER"]
    assert users, "no USER in the final stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0
    assert gid.isdigit() and int(gid) > 0
    for deployment in render("prod").workloads():
        assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)


def test_the_default_command_is_an_exec_form_console_script() -> None:
    (cmd,) = [args for op, args in _final_stage() if op == "CMD"]
    argv = json.loads(cmd)
    assert argv == ["relay-ingest-api"]
    assert argv[0] in console_scripts()
    assert not [op for op, _ in _instructions() if op == "ENTRYPOINT"]


def test_nothing_secret_is_baked_in() -> None:
    for op, args in _instructions():
        if op in ("ENV", "ARG", "LABEL"):
            assert not SECRET_WORDS.search(args), args
        assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", args), args
        assert op != "ADD", "use COPY; ADD fetches URLs and unpacks archives"


def test_it_exposes_the_ports_the_cluster_probes() -> None:
    (exposed,) = [args.split() for op, args in _final_stage() if op == "EXPOSE"]
    settings = render("prod").settings()
    assert {str(settings.api_port), str(settings.health_port)} == set(exposed)


def test_the_build_context_admits_only_what_is_copied() -> None:
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "**", "ignore everything, then admit what the image needs"
    admitted = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set()
    for op, args in _instructions():
        if op == "COPY" and not args.startswith("--from"):
            copied.update(part.rstrip("/").removeprefix("./") for part in args.split()[:-1])
    assert copied == admitted
    assert all((ROOT / path).exists() for path in copied)


def test_there_is_no_syntax_directive_so_buildkit_pulls_no_frontend_image() -> None:
    directives = [
        line
        for line in DOCKERFILE.read_text().splitlines()
        if re.match(r"#\s*syntax\s*=", line.strip(), re.IGNORECASE)
    ]
    assert directives == []


def test_every_package_root_is_copied_before_the_project_is_installed() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {path.split("/", 1)[0] for path in tool["package-dir"].values()}
    assert roots == {"libs", "services"}
    instructions = _instructions()
    install = next(
        i for i, (op, args) in enumerate(instructions) if _installs_the_project(op, args)
    )
    copied_before = {
        part.rstrip("/").removeprefix("./")
        for op, args in instructions[:install]
        if op == "COPY" and not args.startswith("--from")
        for part in args.split()[:-1]
    }
    assert roots | {"pyproject.toml"} <= copied_before


def _installs_the_project(op: str, args: str) -> bool:
    return op == "RUN" and bool(re.search(r"pip install [^&]*--no-deps[^&]* \.(\s|$)", args))


def _pip_installs() -> list[str]:
    """Every ``pip install`` command of a RUN, in order."""
    return [
        part.strip()
        for op, args in _instructions()
        if op == "RUN"
        for part in args.split("&&")
        if "pip install " in part
    ]


def test_dependencies_come_only_from_the_hashed_lock_and_the_project_without_them() -> None:
    installs = _pip_installs()
    assert len(installs) == 2, installs
    lock, project = installs
    assert "--require-hashes" in lock.split() and "--only-binary=:all:" in lock.split()
    assert lock.split()[-2:] == ["-r", "requirements.lock"]
    assert {"--no-deps", "--no-build-isolation"} <= set(project.split())
    assert project.split()[-1] == "."
    copies = [args.split() for op, args in _instructions() if op == "COPY"]
    assert ["deploy/docker/requirements.lock", "./"] in copies


def _documented_docker_run(service: str) -> list[str]:
    """The deployment page's ``docker run`` command for ``service``, as argv."""
    text = DEPLOYMENT_DOC.read_text().replace("\\\n", " ")
    (line,) = [
        line
        for line in text.splitlines()
        if line.startswith("docker run ") and line.split("#")[0].split()[-1] == service
    ]
    return shlex.split(line.split(" #")[0])


def _image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for op, args in _final_stage():
        if op == "ENV":
            env.update(dict(pair.split("=", 1) for pair in shlex.split(args)))
    return env


def test_the_documented_docker_run_example_has_everything_the_service_needs() -> None:
    argv = _documented_docker_run("relay-row-worker")
    assert argv[:3] == ["docker", "run", "--rm"]
    tag = re.search(
        r"docker build -f deploy/docker/Dockerfile -t (\S+) \.", DEPLOYMENT_DOC.read_text()
    )
    assert tag is not None and argv[-2:] == [tag[1], "relay-row-worker"]
    assert argv[-1] in console_scripts()
    assert "--network" in argv and argv[argv.index("--network") + 1] == "host"
    env = dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "-e")
    # The broker, and the ledger it reads for slices that come back (which rows have an
    # outcome already).
    assert set(env) == {"RELAY_AMQP_URL", "RELAY_DATABASE_URL"}
    assert env["RELAY_AMQP_URL"].startswith("amqp://")
    assert env["RELAY_DATABASE_URL"].startswith("postgresql://")
    assert all("@127.0.0.1:" in url for url in env.values())
    (mount,) = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-v"]
    source, target, mode = mount.split(":")
    assert target == _image_env()["RELAY_ROUTES_FILE"] and mode == "ro"
    routes = source.replace("$PWD", str(ROOT))
    assert load_aliases(routes, {}).names() == [
        "gpt-4o-mini",
        "sim-claude",
        "text-embedding-3-small",
    ]


def _stage(name: str) -> list[tuple[str, str]]:
    """The instructions of the stage named ``name``, its FROM first."""
    instructions = _instructions()
    starts = [i for i, (op, _) in enumerate(instructions) if op == "FROM"] + [len(instructions)]
    for start, end in itertools.pairwise(starts):
        if instructions[start][1].split()[-1] == name:
            return instructions[start:end]
    raise AssertionError(f"no stage {name}")


def test_the_image_carries_no_dev_only_code_and_the_simulator_has_a_stage_of_its_own() -> None:
    """The default target (the final stage) takes only the build's virtualenv, whose wheel
    leaves the simulator and ``relay dev`` out (tests/deploy/test_packaging.py); the
    simulator is added by the ``upstream-sim`` stage alone, which compose and the dev
    overlay build with ``--target``."""
    final = _final_stage()
    assert final[0][1].split()[-1] == "runtime"
    copies = [args for op, args in final if op == "COPY"]
    assert copies == ["--from=build /opt/relay /opt/relay"]
    assert not [args for op, args in final if "upstream" in args or "relay_dev" in args]
    sim = _stage("upstream-sim")
    assert sim[0][1] == "build AS upstream-sim"
    assert any("services/upstream_sim" in args for op, args in sim if op == "RUN")
    (cmd,) = [args for op, args in sim if op == "CMD"]
    assert json.loads(cmd) == ["relay-upstream-sim"]
    users = [args for op, args in sim if op == "USER"]
    assert users == ["10001:10001"]
