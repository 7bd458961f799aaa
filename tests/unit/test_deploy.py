"""The recipes of deploy/ against the code: every file parses; every jobtui command line in
them parses with the real CLI parser (and its durations with the real duration parser); the
probes, ports, signals and timeouts agree with what the code serves and does; and
`systemd-analyze verify` accepts the units where it is installed."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobtui.cli.main import build_parser
from jobtui.cli.run import STOP_SIGNALS
from jobtui.core.registry import load_app
from jobtui.kernel.durations import parse_duration
from jobtui.service.endpoints import LIVE_PATH, READY_PATH

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
SIGNAL_NAMES = {signal.Signals(s).name for s in STOP_SIGNALS}
# What a worker needs past --shutdown-timeout to write its last outcomes and exit, and the
# most a recipe should give it.
STOP_MARGIN = (10.0, 60.0)


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path)
    return parser


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, continuation lines joined."""
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    text = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def yaml_documents(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def compose() -> dict[str, Any]:
    [document] = yaml_documents(DEPLOY / "docker" / "compose.yaml")
    assert isinstance(document, dict)
    return document


def kubernetes() -> dict[str, dict[str, Any]]:
    """Every manifest, by kind."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for document in yaml_documents(path):
            found[document["kind"]] = document
    return found


def parse(argv: list[str]) -> Any:
    """`argv` (after `jobtui`) through the real parser: a mistake fails the test, not exits."""
    parser = build_parser()
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"jobtui {shlex.join(argv)} does not parse (exit {exc.code})") from None


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def command_lines() -> Iterator[tuple[str, list[str]]]:
    """Every jobtui command line in deploy/, as (where, argv after `jobtui`)."""
    for path in UNITS:
        for line in unit(path)["Service"].get("ExecStart", "").splitlines():
            argv = shlex.split(line)
            assert Path(argv[0]).name == "jobtui", (path.name, argv)
            yield path.name, argv[1:]
    for word, rest in dockerfile():
        if word == "HEALTHCHECK":
            argv = json.loads(rest.split("CMD", 1)[1])
            assert argv[0] == "jobtui"
            yield "Dockerfile HEALTHCHECK", argv[1:]
        if word == "CMD" and json.loads(rest) != ["--help"]:  # the base image's default: jobtui --help
            yield "Dockerfile CMD", json.loads(rest)
    for name, service in compose()["services"].items():
        if "command" in service and service.get("image", "").startswith("jobtui:"):
            yield f"compose {name}", service["command"]
    for kind, manifest in kubernetes().items():
        for container in containers(manifest):
            yield f"{kind} {container['name']}", container["args"]


def containers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    spec = manifest.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", []))


def test_every_recipe_file_parses() -> None:
    files = sorted(p for p in DEPLOY.rglob("*") if p.is_file())
    assert {p.suffix for p in files} <= {".service", ".env", ".yaml", ".md", ""}, files
    for path in files:
        if path.suffix == ".service":
            sections = unit(path).sections()
            assert "Unit" in sections and "Service" in sections, path
        elif path.suffix == ".yaml":
            assert yaml_documents(path), path
        elif path.suffix == ".env":
            for line in path.read_text().splitlines():
                assert not line.strip() or line.startswith("#") or re.fullmatch(r"[A-Z_]+=\S+", line), (path, line)
    assert [w for w, _ in dockerfile()].count("FROM") == 2


def test_every_command_line_parses_with_the_real_cli() -> None:
    seen = list(command_lines())
    assert len(seen) >= 10, seen
    commands = set()
    for where, argv in seen:
        args = parse(argv)
        commands.add(args.command)
        for duration in ("--shutdown-timeout", "--wait-for-db", "--lease", "--poll"):
            value = option(argv, duration)
            if value is not None:
                parse_duration(value)
        assert "--dsn" not in argv, f"{where}: a DSN on a command line shows to every user of the host"
    assert {"worker", "scheduler", "migrate", "health"} <= commands
    load_app("jobtui.cli.demo:jobs")  # what the compose file runs


def test_systemd_units_agree_with_the_code() -> None:
    names = {p.name for p in UNITS}
    assert {"jobtui-worker.service", "jobtui-scheduler.service", "jobtui-migrate.service"} <= names
    for path in UNITS:
        service = unit(path)["Service"]
        argv = shlex.split(service["ExecStart"])[1:]
        assert service.get("User") not in (None, "root"), path.name
        if argv[0] == "migrate":
            assert service["Type"] == "oneshot"
            continue
        # The code says READY=1 and feeds the watchdog (tests/integration/test_probes.py).
        assert (service["Type"], service["NotifyAccess"]) == ("notify", "main"), path.name
        assert service["KillSignal"] in SIGNAL_NAMES
        assert parse_duration(service["WatchdogSec"]) >= 2
        assert parse_duration(service["TimeoutStartSec"]) > parse_duration(option(argv, "--wait-for-db") or "60s")
        shutdown = parse_duration(option(argv, "--shutdown-timeout") or "30s") if argv[0] == "worker" else 0.0
        low, high = STOP_MARGIN
        assert shutdown + low <= parse_duration(service["TimeoutStopSec"]) <= shutdown + high, path.name
        assert option(argv, "--metrics-addr") == "127.0.0.1" and option(argv, "--metrics-token-file"), path.name
    ports = [option(shlex.split(unit(p)["Service"]["ExecStart"]), "--metrics-port") for p in UNITS]
    ports = [p for p in ports if p]
    assert len(ports) == len(set(ports)) == 2  # worker and scheduler on one host


def test_the_image_and_compose_agree_with_the_code() -> None:
    instructions = dockerfile()
    user = [rest for word, rest in instructions if word == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
    assert [rest for word, rest in instructions if word == "STOPSIGNAL"] == ["SIGTERM"]
    assert "SIGTERM" in SIGNAL_NAMES
    runtime = instructions[[w for w, _ in instructions].index("FROM", 1) :]
    assert runtime[0][1].endswith("-slim")
    copied = [rest for word, rest in runtime if word == "COPY"]
    assert copied == ["--from=build /dist/ /tmp/dist/"]  # the wheel only, not the source tree
    healthcheck = json.loads(next(rest for word, rest in instructions if word == "HEALTHCHECK").split("CMD", 1)[1])
    port = option(healthcheck, "--port")
    assert healthcheck[:2] == ["jobtui", "health"] and port is not None
    assert [rest for word, rest in instructions if word == "EXPOSE"] == [port]
    services = compose()["services"]
    assert {"postgres", "pgbouncer", "migrate", "scheduler"} <= set(services)
    workers = [s for s in services.values() if s.get("command", [None])[0] == "worker"]
    assert len(workers) == 2
    assert services["pgbouncer"]["environment"]["POOL_MODE"] == "transaction"
    for name, service in services.items():
        command = service.get("command")
        if not command or not service.get("image", "").startswith("jobtui:"):
            continue
        env = service["environment"]
        assert "PGPASSWORD" in env and "@" not in env["JOBTUI_DSN"].split("@")[0].split("//")[1]
        if command[0] == "migrate":
            assert "pgbouncer" not in env["JOBTUI_DSN"], "migrate goes straight to PostgreSQL"
            continue
        # The image's HEALTHCHECK asks this port.
        assert option(command, "--metrics-port") == port, name
        assert service["stop_signal"] in SIGNAL_NAMES
        assert "@pgbouncer:" in env["JOBTUI_DSN"] and env["JOBTUI_POOLER"] == "transaction", name
        assert "@postgres:" in env["JOBTUI_LISTEN_DSN"], f"{name}: LISTEN cannot go through the pooler"
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        shutdown = parse_duration(option(command, "--shutdown-timeout") or "30s") if command[0] == "worker" else 0
        assert shutdown + STOP_MARGIN[0] <= parse_duration(service["stop_grace_period"]) <= shutdown + STOP_MARGIN[1]


def test_kubernetes_manifests_agree_with_the_code() -> None:
    manifests = kubernetes()
    assert {"Job", "Deployment", "PodDisruptionBudget", "Kustomization"} <= set(manifests)
    listed = set(manifests["Kustomization"]["resources"])
    assert listed == {p.name for p in (DEPLOY / "kubernetes").glob("*.yaml")} - {"kustomization.yaml"}
    [migrate] = containers(manifests["Job"])
    assert migrate["args"] == ["migrate"]
    deployment = manifests["Deployment"]
    pod = deployment["spec"]["template"]
    [worker] = containers(deployment)
    args = worker["args"]
    assert args[0] == "worker"
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    assert str(ports["metrics"]) == option(args, "--metrics-port")
    for probe, path in (("livenessProbe", LIVE_PATH), ("readinessProbe", READY_PATH)):
        get = worker[probe]["httpGet"]
        assert get["path"] == path and get["port"] in ports, probe
        assert worker[probe]["timeoutSeconds"] >= 3  # /healthz waits up to 2 s for the event loop
    shutdown = parse_duration(option(args, "--shutdown-timeout") or "30s")
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert shutdown + STOP_MARGIN[0] <= grace <= shutdown + STOP_MARGIN[1]
    for manifest in (manifests["Job"], deployment):
        context = manifest["spec"]["template"]["spec"]["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
        for container in containers(manifest):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert "--dsn" not in container["args"]
            assert all("@" not in e.get("value", "").split("@")[0].split("//")[-1] for e in container["env"])
    pdb = manifests["PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_systemd_analyze_verifies_the_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here: the units are checked by the tests above only")
    jobtui = Path(sys.executable).parent / "jobtui"
    if not jobtui.exists():
        pytest.skip(f"no jobtui script beside {sys.executable} to stand for /opt/jobtui/bin/jobtui")
    for path in UNITS:
        # The units name /opt/jobtui/bin/jobtui, which verify wants to find: point it here.
        text = path.read_text().replace("/opt/jobtui/bin/jobtui", str(jobtui))
        (tmp_path / path.name).write_text(text)
    result = subprocess.run(
        [analyze, "verify", "--man=no", *(str(tmp_path / p.name) for p in UNITS)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    # Lines about units outside deploy/ (the host's own) are not ours to judge.
    ours = [line for line in (result.stdout + result.stderr).splitlines() if "jobtui" in line]
    assert result.returncode == 0 and not ours, result.stdout + result.stderr


def test_grants_sql_marks_the_roles_it_creates_as_uninstall_looks_for_them() -> None:
    from jobtui.core.uninstall import ROLE_MARK

    grants = (DEPLOY.parent / "docs" / "grants.sql").read_text()
    [mark] = re.findall(r"format\('((?:[^']|'')*)',", grants)
    assert mark.replace("''", "'") == ROLE_MARK


def _slug(heading: str) -> str:
    """A heading's anchor, as GitHub makes it."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_the_links_between_the_docs_land_on_a_heading() -> None:
    root = DEPLOY.parent
    pages = [root / "README.md", root / "CHANGELOG.md", DEPLOY / "README.md", *sorted((root / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", page.read_text()):
            if target.startswith(("http:", "https:", "mailto:")):
                continue
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and path.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{page.name}: {target}#{anchor}")
    assert not broken, broken


# -- the recipes as a user follows them ---------------------------------------------------------


def readme_block(heading: str, language: str) -> str:
    """The first ```language block under `heading` in deploy/README.md."""
    text = (DEPLOY / "README.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    return section.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def unit_files() -> dict[str, dict[str, Any]]:
    """Each unit's user, and the files it reads: its environment file, and what that names
    (the password file, the CA of the DSN), and its metrics token."""
    found = {}
    for path in UNITS:
        service = unit(path)["Service"]
        env_file = service["EnvironmentFile"].lstrip("-")
        env = dict(
            line.split("=", 1) for line in (DEPLOY / "systemd" / Path(env_file).name).read_text().splitlines()
            if line and not line.startswith("#")
        )  # fmt: skip
        ca = re.search(r"sslrootcert=([^&\s]+)", env["JOBTUI_DSN"])
        token = option(shlex.split(service["ExecStart"]), "--metrics-token-file")
        files = [env_file, env["PGPASSFILE"], *([ca.group(1)] if ca else []), *([token] if token else [])]
        found[path.name] = {"user": service["User"], "group": service["Group"], "files": files,
                            "password": env["PGPASSFILE"]}  # fmt: skip
    return found


def test_the_migrate_unit_runs_under_an_os_user_of_its_own() -> None:
    units = unit_files()
    migrate = units.pop("jobtui-migrate.service")
    assert {u["user"] for u in units.values()} == {"jobtui"}
    assert migrate["user"] not in ("jobtui", "root") and migrate["group"] != "jobtui"
    block = readme_block("## systemd", "sh")
    for user in {migrate["user"], "jobtui"}:
        assert re.search(rf"^useradd .* {user}$", block, re.M), f"no step makes the user {user}"


# What the README's systemd steps run here: everything but installing, systemd and the database.
STUBS = """
python3() { mkdir -p /opt/jobtui/bin && printf '#!/bin/sh\\n' > /opt/jobtui/bin/pip && chmod +x /opt/jobtui/bin/pip; }
systemctl() { :; }
cp() { :; }
runuser() { :; }
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(c) for c in ("unshare", "useradd", "runuser", "openssl")),
    reason="needs root, unshare, useradd, runuser and openssl: the steps run in a mount namespace of their own",
)
def test_the_systemd_steps_run_as_written_and_each_unit_reads_only_its_own_secrets(tmp_path: Path) -> None:
    """The README's systemd steps, run by bash in a mount namespace whose /etc, /var/log and
    /opt are copies or empty: the users and files they make are gone with it. Then each unit's user reads
    every file its unit names, and the workers' user cannot read the schema owner's password."""
    units = unit_files()
    workers_user = units["jobtui-worker.service"]["user"]
    owners_password = units["jobtui-migrate.service"]["password"]
    checks = []
    for name, u in units.items():
        for path in u["files"]:
            checks.append(
                f"runuser -u {u['user']} -- cat {shlex.quote(path)} >/dev/null || echo 'UNREADABLE {name} {path}'"
            )
    checks.append(
        f"runuser -u {workers_user} -- cat {owners_password} >/dev/null 2>&1 && echo 'READABLE {owners_password}'"
    )
    work = tmp_path / "repo"
    work.mkdir()
    (work / "deploy").symlink_to(DEPLOY)
    (work / "db-ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    script = "\n".join([
        "set -eu",
        f"cp -a /etc {tmp_path}/etc && mount --bind {tmp_path}/etc /etc",
        f"mkdir {tmp_path}/log && mount --bind {tmp_path}/log /var/log && mount -t tmpfs tmpfs /opt",
        f"cd {work}",
        f"( {STUBS}\n{readme_block('## systemd', 'sh')} ) <<'PASSWORDS'\nworker-secret\nowner-secret\nPASSWORDS",
        *checks,
        "stat -c '%a %U %G %n' /etc/jobtui /etc/jobtui/*",
        "cat /etc/jobtui/pgpass /etc/jobtui/pgpass-owner",
    ])  # fmt: skip
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "UNREADABLE" not in done.stdout and "READABLE" not in done.stdout, done.stdout
    modes = {line.split()[-1]: line.split()[:3] for line in done.stdout.splitlines() if line.startswith(("6", "7"))}
    # libpq reads a password file only when nobody but its owner may: mode 600.
    assert modes["/etc/jobtui/pgpass"] == ["600", "jobtui", "jobtui"], modes
    assert modes["/etc/jobtui/pgpass-owner"] == ["600", "jobtui-migrate", "jobtui-migrate"], modes
    assert "db.internal:5432:app:jobtui_worker:worker-secret" in done.stdout
    assert "db.internal:5432:app:jobtui_owner:owner-secret" in done.stdout
    assert not Path("/etc/jobtui").exists() and not Path("/opt/jobtui").exists()  # nothing left here


def test_the_app_code_in_the_image_is_not_the_running_users_to_change() -> None:
    every = dockerfile()
    instructions = every[[w for w, _ in every].index("FROM", 1) :]  # the image's stage, not the build's
    app_image = [
        (w.upper(), r)
        for w, r in (
            line.split(" ", 1) for line in readme_block("## Docker and Compose", "dockerfile").strip().splitlines()
        )
    ]
    for word, rest in [*every, *app_image]:
        assert not (word in ("COPY", "ADD") and "--chown" in rest), f"{word} {rest}: the code would be the user's"
    words = [w for w, _ in instructions]
    user = words.index("USER")
    # /app (the working directory, where --app modules are found) is made by root before USER.
    assert instructions[words.index("WORKDIR")][1] == "/app" and words.index("WORKDIR") < user
    made = [rest for word, rest in instructions[:user] if word == "RUN" and "/app" in rest]
    assert made and "-o root" in made[-1], made
    assert ("ENV", "PYTHONDONTWRITEBYTECODE=1") in [(w, r.split()[0]) for w, r in instructions]


# The schema validators must not reach the network: any fetch they tried would go here.
OFFLINE = {name: "http://127.0.0.1:9" for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}


def validate(tool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **OFFLINE, "NO_PROXY": "", "no_proxy": ""}
    return subprocess.run(
        [sys.executable, "-m", tool, *map(str, args)], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_the_kubernetes_manifests_and_the_compose_file_pass_their_schemas_offline(tmp_path: Path) -> None:
    from importlib.resources import files

    # Both tools ship their schemas: Kubernetes' per version, the compose specification vendored.
    assert (files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").is_file()
    shipped = [p.name for p in (files("kubernetes_validate") / "kubernetes-json-schema").iterdir()]
    assert any(name.endswith("-local-strict") for name in shipped), shipped
    manifests = [p for p in sorted((DEPLOY / "kubernetes").glob("*.yaml")) if p.name != "kustomization.yaml"]
    checked = validate("kubernetes_validate", "--strict", *manifests)
    assert checked.returncode == 0 and checked.stdout.count(" passed for resource ") == 3, (
        checked.stdout + checked.stderr
    )
    compose_file = DEPLOY / "docker" / "compose.yaml"
    checked = validate("check_jsonschema", "--builtin-schema", "vendor.compose-spec", compose_file)
    assert checked.returncode == 0 and "ok -- validation done" in checked.stdout, checked.stdout + checked.stderr
    # And each fails a recipe with a field its schema does not know.
    broken = tmp_path / "worker.yaml"
    broken.write_text(
        (DEPLOY / "kubernetes" / "worker-deployment.yaml").read_text().replace("periodSeconds", "periodSecs")
    )
    assert validate("kubernetes_validate", "--strict", broken).returncode != 0
    broken = tmp_path / "compose.yaml"
    broken.write_text(compose_file.read_text().replace("stop_grace_period", "stop_grace"))
    assert validate("check_jsonschema", "--builtin-schema", "vendor.compose-spec", broken).returncode != 0
