"""The deployment files as data, for tests that check them against the code.

Nothing here can be applied or built on this machine (no Docker engine, no Google Cloud), so the
tests read the files: the Dockerfile (its stages and instructions), ``infra/*.tf`` (parsed with
python-hcl2, with a small resolver for the expressions the services' settings are built from) and
``cloudbuild.yaml``.
"""

from __future__ import annotations

import ast
import json
import operator
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import hcl2
import yaml
from hcl2 import SerializationOptions

from core.settings import PROJECT_ROOT

DOCKERFILE = PROJECT_ROOT / "Dockerfile"
DOCKERIGNORE = PROJECT_ROOT / ".dockerignore"
ENTRYPOINT = ["/opt/venv/bin/python", "-m", "ops.entrypoint"]  # the image's (Dockerfile); ops/entrypoint.py
INFRA = PROJECT_ROOT / "infra"
CLOUDBUILD = PROJECT_ROOT / "cloudbuild.yaml"

# Values Terraform only knows once applied, and that the resolver needs: made up, but of the real form.
PROJECT_ID = "acme-specialists"
PROJECT_NUMBER = "123456789012"
# What a deployment must give (variables without a default): made up, but of the real form.
CONSOLE_OPERATORS = ["alice@example.com", "bob@example.com"]


# --- Dockerfile ------------------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY...
    args: str

    def exec_form(self) -> list[str] | None:
        """The JSON array form of CMD/ENTRYPOINT/HEALTHCHECK CMD, or None for the shell form."""
        text = self.args
        if self.keyword == "HEALTHCHECK":
            text = text.split(" CMD ", 1)[1].strip() if " CMD " in text else ""
        return json.loads(text) if text.startswith("[") else None


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        """ENV KEY=VALUE pairs of this stage (the form the Dockerfile uses)."""
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for pair in instruction.args.split():
                key, _, value = pair.partition("=")
                values[key] = value
        return values


def dockerfile_stages(path: Path = DOCKERFILE) -> list[Stage]:
    """The stages of a Dockerfile, continuation lines joined, comments dropped, global ARGs resolved in FROM."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "ARG" and not stages:
            name, _, default = args.partition("=")
            global_args[name] = default
            continue
        if keyword == "FROM":
            base, _, name = re.sub(r"\s+as\s+", " AS ", args, flags=re.IGNORECASE).partition(" AS ")
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args.get(m.group(1), m.group(0)), base.strip())
            stages.append(Stage(name=name.strip() or str(len(stages)), base=base))
            continue
        stages[-1].instructions.append(Instruction(keyword, args))
    return stages


# --- Terraform -----------------------------------------------------------------------------------

_HCL_OPTIONS = SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)
_INTERPOLATION = re.compile(r"\$\{([^{}]*)\}")
_REFERENCE = re.compile(r"[A-Za-z_][\w-]*(?:\.[\w-]+)+")
# `COND ? A : B`, with spaces around both operators (as terraform fmt writes it).
_CONDITIONAL = re.compile(r"(\S+)\s+\?\s+(.+?)\s+:\s+(.+)", re.DOTALL)
# `{for K, V in MAP : K => V if COND}`: a map kept whole or emptied by a condition.
_FILTERED_MAP = re.compile(r"\{for (\w+), (\w+) in (\S+) : \1 => \2 if (\S+)\}")
_LITERALS = {"null": None, "true": True, "false": False}
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


class Unresolvable(Exception):
    pass


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return _ARITHMETIC[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise Unresolvable(ast.dump(node))


class Terraform:
    """Every ``*.tf`` file of a folder, merged; ``resolve`` evaluates the expressions services' env is made of.

    The resolver knows variables (their defaults, or ``given``), locals, literal resource attributes
    and the computed attributes the services use (an account's email, a secret's id, an instance's
    connection name), plus ``coalesce``, ``join``, arithmetic, ``COND ? A : B``, list literals and a map filtered
    by a condition (``{for k, v in MAP : k => v if COND}``). Anything else raises ``Unresolvable``.
    """

    def __init__(self, folder: Path = INFRA, given: dict[str, Any] | None = None) -> None:
        self.variables: dict[str, dict] = {}
        self.locals: dict[str, Any] = {}
        self.resources: dict[tuple[str, str], dict] = {}
        self.outputs: dict[str, dict] = {}
        self.data: dict[tuple[str, str], dict] = {}
        self.files: dict[str, dict] = {}
        self.given = {"project_id": PROJECT_ID, "console_operators": CONSOLE_OPERATORS, **(given or {})}
        for path in sorted(folder.glob("*.tf")):
            document = hcl2.loads(path.read_text(), serialization_options=_HCL_OPTIONS)
            self.files[path.name] = document
            for block in document.get("variable", []):
                self.variables.update(block)
            for block in document.get("locals", []):
                self.locals.update(block)
            for block in document.get("output", []):
                self.outputs.update(block)
            for kind, into in (("resource", self.resources), ("data", self.data)):
                for block in document.get(kind, []):
                    for type_name, named in block.items():
                        for name, body in named.items():
                            into[(type_name, name)] = body

    # --- reading --------------------------------------------------------------------------------

    def resource(self, type_name: str, name: str) -> dict:
        return self.resources[(type_name, name)]

    def of_type(self, type_name: str) -> dict[str, dict]:
        return {name: body for (kind, name), body in self.resources.items() if kind == type_name}

    def default(self, variable: str) -> Any:
        if variable in self.given:
            return self.given[variable]
        if "default" not in self.variables[variable]:
            raise Unresolvable(f"variable {variable} has no default; pass it in `given`")
        return self.variables[variable]["default"]

    # --- resolving ------------------------------------------------------------------------------

    def resolve(self, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        whole = _INTERPOLATION.fullmatch(value) or _whole_expression(value)
        if whole:
            return self._expression(whole.group(1))
        return _INTERPOLATION.sub(lambda m: str(self._expression(m.group(1))), value)

    def _expression(self, text: str) -> Any:
        text = text.strip()
        if text in _LITERALS:
            return _LITERALS[text]
        if text in ("[]", "{}"):
            return [] if text == "[]" else {}
        conditional = _CONDITIONAL.fullmatch(text)
        if conditional:
            condition = self._expression(conditional.group(1))
            if not isinstance(condition, bool):
                raise Unresolvable(f"a condition that is not a bool: {text}")
            return self._expression(conditional.group(2) if condition else conditional.group(3))
        filtered = _FILTERED_MAP.fullmatch(text)
        if filtered:
            source = self._expression(filtered.group(3))
            if not isinstance(source, dict):
                raise Unresolvable(f"for over a {type(source).__name__}: {text}")
            return dict(source) if self._expression(filtered.group(4)) is True else {}
        listed = re.fullmatch(r"\[([^\[\]]*)\]", text)
        if listed:
            return [self._expression(item) for item in listed.group(1).split(",") if item.strip()]
        call = re.fullmatch(r"coalesce\((.*)\)", text)
        if call:
            for argument in call.group(1).split(","):
                value = self._expression(argument)
                if value not in (None, ""):
                    return value
            raise Unresolvable(f"coalesce of nothing: {text}")
        call = re.fullmatch(r'join\("([^"]*)",\s*(.*)\)', text)
        if call:
            items = self._expression(call.group(2))
            if not isinstance(items, list):
                raise Unresolvable(f"join of a {type(items).__name__}: {text}")
            return call.group(1).join(str(item) for item in items)
        if _REFERENCE.fullmatch(text):
            return self.reference(text)
        if re.fullmatch(r"\"[^\"]*\"", text):
            return text[1:-1]
        arithmetic = _REFERENCE.sub(lambda m: repr(self.reference(m.group(0))), text)
        try:
            return _evaluate(ast.parse(arithmetic, mode="eval"))
        except (SyntaxError, Unresolvable) as exc:
            raise Unresolvable(f"the tests cannot evaluate ${{{text}}} ({exc})") from None

    def reference(self, ref: str) -> Any:
        parts = ref.split(".")
        if parts[0] == "var":  # an object variable's attribute: var.database_pools.api.size
            value = self.default(parts[1])
            for part in parts[2:]:
                value = value[part]
            return value
        if parts[0] == "local":
            value: Any = self.locals[parts[1]]
            for part in parts[2:]:
                value = value[part]
            return self.resolve(value)
        if ref == "data.google_project.this.number":
            return PROJECT_NUMBER
        if len(parts) == 3 and (parts[0], parts[1]) in self.resources:
            return self._attribute(parts[0], parts[1], parts[2])
        raise Unresolvable(f"the tests cannot resolve {ref}; teach tests/deploy/manifests.py")

    def _attribute(self, type_name: str, name: str, attribute: str) -> Any:
        body = self.resource(type_name, name)
        project = self.default("project_id")
        if type_name == "google_service_account" and attribute == "email":
            return f"{self.resolve(body['account_id'])}@{project}.iam.gserviceaccount.com"
        if type_name == "google_sql_database_instance" and attribute == "connection_name":
            return f"{project}:{self.resolve(body['region'])}:{self.resolve(body['name'])}"
        if type_name == "google_secret_manager_secret" and attribute == "id":
            return f"projects/{project}/secrets/{self.resolve(body['secret_id'])}"
        if type_name == "random_password" and attribute == "result":
            return ("Pw0" * 100)[: int(self.resolve(body["length"]))]
        if attribute in body:
            return self.resolve(body[attribute])
        raise Unresolvable(f"{type_name}.{name}.{attribute} is computed; teach tests/deploy/manifests.py")

    def name_of(self, expression: str) -> tuple[str, str]:
        """``${google_x.y.attr}`` -> (google_x, y): which resource an expression points at."""
        match = _INTERPOLATION.fullmatch(expression)
        if not match:
            raise Unresolvable(f"{expression!r} is not a reference")
        parts = match.group(1).strip().split(".")
        return parts[0], parts[1]


def _whole_expression(value: str) -> re.Match | None:
    """``${...}`` around the whole value, braces inside it balanced (``${COND ? local.x : {}}``)."""
    if not (value.startswith("${") and value.endswith("}")):
        return None
    depth = 0
    for position, char in enumerate(value[1:], start=1):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return re.fullmatch(r"\$\{(.*)\}", value, re.DOTALL) if position == len(value) - 1 else None
    return None


@dataclass
class ContainerEnv:
    """What one Cloud Run container is given: plain values, and secrets by environment variable name."""

    plain: dict[str, str]
    secrets: dict[str, tuple[str, str]]  # variable -> (terraform resource name of the secret, its secret id)

    @property
    def names(self) -> set[str]:
        return set(self.plain) | set(self.secrets)


def container(tf: Terraform, type_name: str, name: str) -> dict:
    """The service's (or job's) own container, the one the image's command runs in: its one static ``containers``
    block. Sidecars come from ``dynamic "containers"`` blocks (``sidecars``)."""
    template = tf.resource(type_name, name)["template"][0]
    if type_name == "google_cloud_run_v2_job":
        template = template["template"][0]
    containers = template["containers"]
    assert len(containers) == 1, f"{name}: one container of its own expected (a sidecar is a dynamic block)"
    return containers[0]


def revision_template(tf: Terraform, type_name: str, name: str) -> dict:
    template = tf.resource(type_name, name)["template"][0]
    return template["template"][0] if type_name == "google_cloud_run_v2_job" else template


def expand_dynamic(tf: Terraform, within: dict, block_type: str) -> list[dict]:
    """The blocks ``dynamic "<block_type>"`` makes inside ``within``, as Terraform expands them: one per item of its
    for_each, with ``<block_type>.value`` (and ``.key``) put in."""
    made = []
    for dynamic in within.get("dynamic", []):
        if block_type not in dynamic:
            continue
        items = tf.resolve(dynamic[block_type]["for_each"])
        pairs = items.items() if isinstance(items, dict) else enumerate(items)
        for key, value in pairs:
            made.append(_put_in(dynamic[block_type]["content"][0], {f"${{{block_type}.key}}": key,
                                                                   f"${{{block_type}.value}}": value}))
    return made


def _put_in(node: Any, values: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        return {key: _put_in(item, values) for key, item in node.items()}
    if isinstance(node, list):
        return [_put_in(item, values) for item in node]
    return values.get(node, node) if isinstance(node, str) else node


def sidecars(tf: Terraform, type_name: str, name: str) -> list[dict]:
    """The containers a revision runs beside its own (its ``dynamic "containers"`` blocks, expanded)."""
    return expand_dynamic(tf, revision_template(tf, type_name, name), "containers")


def revision_volumes(tf: Terraform, type_name: str, name: str) -> dict[str, dict]:
    """Every volume of a revision by name, its ``dynamic "volumes"`` expanded."""
    template = revision_template(tf, type_name, name)
    return {tf.resolve(v["name"]): v for v in [*template.get("volumes", []), *expand_dynamic(tf, template, "volumes")]}


def mounted_secrets(tf: Terraform, type_name: str, name: str, spec: dict) -> dict[str, str]:
    """The files a container reads from Secret Manager volumes: path inside the container -> the secret's
    Terraform name."""
    volumes = revision_volumes(tf, type_name, name)
    files = {}
    for mount in spec.get("volume_mounts", []):
        volume = volumes[tf.resolve(mount["name"])]
        for secret in volume.get("secret", []):
            _, secret_name = tf.name_of(secret["secret"])
            for item in secret["items"]:
                files[f"{tf.resolve(mount['mount_path']).rstrip('/')}/{tf.resolve(item['path'])}"] = secret_name
    return files


def secret_file(tf: Terraform, secret_name: str) -> Path:
    """The file of infra/ whose text Terraform writes into a secret (``secret_data = file("${path.module}/F")``)."""
    versions = [v for v in tf.of_type("google_secret_manager_secret_version").values()
                if tf.name_of(v["secret"]) == ("google_secret_manager_secret", secret_name)]
    assert len(versions) == 1, f"{secret_name}: one version written by Terraform expected"
    read = re.fullmatch(r'\$\{file\("\$\{path\.module\}/([\w.-]+)"\)\}', versions[0]["secret_data"])
    assert read, f"{secret_name}: its data is not a file of infra/"
    return INFRA / read.group(1)


def container_env(tf: Terraform, type_name: str, name: str) -> ContainerEnv:
    """The env of a service's (or job's) container, following its ``env`` and ``dynamic "env"`` blocks."""
    spec = container(tf, type_name, name)
    plain: dict[str, str] = {}
    secrets: dict[str, tuple[str, str]] = {}

    def secret_ref(block: dict) -> str:
        return block["value_source"][0]["secret_key_ref"][0]["secret"]

    def add_secret(variable: str, expression: str) -> None:
        kind, secret_name = tf.name_of(expression)
        assert kind == "google_secret_manager_secret", f"{variable} must come from a Secret Manager secret"
        secrets[variable] = (secret_name, tf.resolve(tf.resource(kind, secret_name)["secret_id"]))

    for block in spec.get("env", []):
        if "value_source" in block:
            add_secret(block["name"], secret_ref(block))
        else:
            plain[block["name"]] = str(tf.resolve(block["value"]))
    for dynamic in spec.get("dynamic", []):
        if "env" not in dynamic:
            continue
        source = dynamic["env"]["for_each"]
        content = dynamic["env"]["content"][0]
        kind, _ = tf.name_of(source)
        if kind == "local":
            items = tf.locals[source[len("${local."):-1]].items()
        elif kind == "google_secret_manager_secret":
            # for_each over a secret resource that is itself for_each over a variable's names.
            _, secret_name = tf.name_of(source)
            names = tf.resolve(tf.resource(kind, secret_name)["for_each"])
            assert content["name"] == "${env.key}" and secret_ref(content) == "${env.value.secret_id}"
            for variable in names:
                secrets[variable] = (secret_name, f"secret for {variable}")
            continue
        else:
            raise Unresolvable(f"dynamic env over {source}")
        assert content["name"] == "${env.key}"
        for variable, expression in items:
            if "value_source" in content:
                assert secret_ref(content) == "${env.value}"
                add_secret(variable, expression)
            else:
                assert content["value"] == "${env.value}"
                plain[variable] = str(tf.resolve(expression))
    return ContainerEnv(plain=plain, secrets=secrets)


def collector_config(tf: Terraform, type_name: str, name: str, spec: dict) -> dict:
    """The configuration an OpenTelemetry Collector sidecar runs with: the file its ``--config`` names, read from
    the file of infra/ that Terraform writes into the secret mounted there."""
    args = [str(tf.resolve(arg)) for arg in spec.get("args", [])]
    paths = [arg.removeprefix("--config=") for arg in args if arg.startswith("--config=")]
    assert len(paths) == 1, f"{name}: a collector names one --config file"
    secret = mounted_secrets(tf, type_name, name, spec).get(paths[0])
    assert secret, f"{name}: the collector's {paths[0]} is no file of a mounted secret"
    return yaml.safe_load(secret_file(tf, secret).read_text())


def plan_variables(folder: Path, **variables: str) -> subprocess.CompletedProcess:
    """``terraform plan`` of infra/variables.tf alone, copied into ``folder`` (no provider, no backend: nothing is
    downloaded), with ``variables`` given as ``-var`` (a project and an operator unless given): Terraform evaluates
    the variables' validations."""
    terraform = shutil.which("terraform")
    # ./dev check (CI's first step) needs it too: a machine without it fails there, and here, rather than skipping.
    assert terraform is not None, "terraform is not on PATH: install it (./dev check runs terraform fmt with it)"
    shutil.copy(INFRA / "variables.tf", folder / "variables.tf")
    env = {"PATH": str(Path(terraform).parent), "TF_IN_AUTOMATION": "1", "HOME": str(folder), "CHECKPOINT_DISABLE": "1"}
    init = subprocess.run([terraform, "init", "-input=false", "-backend=false", "-no-color"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stdout + init.stderr
    given = {"project_id": "acme", "console_operators": json.dumps(CONSOLE_OPERATORS), **variables}
    return subprocess.run(
        [terraform, "plan", "-input=false", "-lock=false", "-no-color",
         *[arg for name, value in given.items() for arg in ("-var", f"{name}={value}")]],
        cwd=folder, env=env, capture_output=True, text=True, timeout=60,
    )


# --- cloudbuild.yaml -------------------------------------------------------------------------------


@dataclass
class BuildStep:
    id: str
    name: str
    entrypoint: str | None
    args: list[str]
    raw: dict

    @cached_property
    def bash_script(self) -> str | None:
        """The script of a `bash -c` step, run by bash itself or under tini (``tini -- bash -c``); else None."""
        if self.entrypoint == "bash" and self.args[:1] == ["-c"]:
            return self.args[1]
        if self.entrypoint == "tini" and self.args[:3] == ["--", "bash", "-c"]:
            return self.args[3]
        return None

    @cached_property
    def command(self) -> str:
        """What the step runs, as one text (a bash -c script, or the entrypoint and its args)."""
        if self.bash_script is not None:
            return self.bash_script
        return " ".join([self.entrypoint or ""] + self.args).strip()


def cloudbuild(path: Path = CLOUDBUILD) -> dict:
    return yaml.safe_load(path.read_text())


def build_steps(document: dict) -> list[BuildStep]:
    return [
        BuildStep(id=step["id"], name=step["name"], entrypoint=step.get("entrypoint"), args=[str(a) for a in step.get("args", [])], raw=step)
        for step in document["steps"]
    ]


_SUBSTITUTION = re.compile(r"\$\$|\$\{(\w+)\}|\$(\w+)")


def substitute(text: str, values: dict[str, str]) -> str:
    """``text`` as Cloud Build hands it to a step: ``$$`` becomes ``$``, ``${NAME}`` and ``$NAME`` the value.

    Cloud Build refuses a build that names a substitution it does not know, so this raises ``KeyError``.
    """

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return values[match.group(1) or match.group(2)]

    return _SUBSTITUTION.sub(one, text)


def substitutions(document: dict, **built_in: str) -> dict[str, str]:
    """The build's substitutions with ``built_in`` (PROJECT_ID, SHORT_SHA...) given, each resolved in turn
    (``dynamicSubstitutions``: one may name another)."""
    values = dict(built_in)
    for name, value in document["substitutions"].items():
        values[name] = substitute(str(value), values)
    return values
