"""Static sanity of deploy/docker/Dockerfile and .dockerignore (no Docker engine here).

Checks in the spirit of hadolint: multi-stage on a pinned slim base, runs as a numeric
non-root user, exec-form command naming a real console script, nothing secret baked in,
and the build context admits only what the image copies.
"""

from __future__ import annotations

import json
import re

from tests.deploy.manifests import DEPLOY, ROOT, console_scripts, render

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
SECRET_WORDS = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|PRIVATE", re.IGNORECASE)


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
