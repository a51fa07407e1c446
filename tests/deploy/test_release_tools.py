"""infra/release/: the static checks' gate and the image smoke, as far as they run without their tools.

The tools themselves (checkov, hadolint, terraform, podman) run in `./dev check` (CI) and `./dev smoke`
(docs/OPERATIONS.md says when); here: the gate's verdict logic, the baseline kept true against the files, and
both commands needing nothing but the standard library.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys

import pytest

from core.settings import PROJECT_ROOT
from tests.deploy.manifests import Terraform
from tests.deploy.test_locks import NEVER_AT_RUNTIME

RELEASE = PROJECT_ROOT / "infra" / "release"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"release_{name}", RELEASE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


checks = load("checks")
smoke = load("smoke")


def finding(check: str, resource: str, file: str = "infra/database.tf"):
    return checks.Finding("checkov", check, resource, file, "")


def accepted(check: str, resource: str, file: str = "infra/database.tf"):
    return checks.Accepted(check, resource, file, "a reason")


def test_a_finding_not_in_the_baseline_is_new_and_an_entry_matching_nothing_is_stale():
    found = [finding("CKV_GCP_26", "google_compute_subnetwork.run"), finding("CKV_GCP_6", "google_sql_database_instance.main")]
    baseline = [accepted("CKV_GCP_26", "google_compute_subnetwork.run"), accepted("CKV_GCP_52", "google_sql_database_instance.main")]
    new, stale = checks.compare(found, baseline)
    assert [f.check for f in new] == ["CKV_GCP_6"]
    assert [a.check for a in stale] == ["CKV_GCP_52"]
    # The same check on another resource, or in another file, is another finding.
    new, _ = checks.compare([finding("CKV_GCP_26", "google_compute_subnetwork.other")], baseline)
    assert len(new) == 1


def test_a_class_accepts_one_check_under_one_folder_only_and_is_stale_when_it_covers_nothing():
    classes = [checks.AcceptedClass("CKV_SECRET_6", "tests/", "made-up secrets")]
    in_tests = finding("CKV_SECRET_6", "hash-1", "tests/app/test_push.py")
    in_code = finding("CKV_SECRET_6", "hash-2", "workers/dispatch/push.py")
    other_check = finding("CKV_SECRET_2", "hash-3", "tests/app/test_push.py")
    new, stale = checks.compare([in_tests, in_code, other_check], [], classes)
    assert new == [in_code, other_check] and stale == []
    _, stale = checks.compare([in_code], [], classes)
    assert stale == classes
    for entry in checks.load_classes():
        assert (PROJECT_ROOT / entry.under).is_dir() and len(entry.reason) > 40, entry


def test_checkovs_json_is_read_as_one_report_or_one_per_framework():
    failed = {"check_id": "CKV_GCP_6", "resource": "google_sql_database_instance.main", "file_path": "/infra/database.tf",
              "check_name": "SSL"}
    one = json.dumps({"results": {"failed_checks": [failed], "passed_checks": []}})
    several = json.dumps([{"results": {"failed_checks": [failed]}}, {"passed": 0, "failed": 0}])
    for text in (one, several):
        assert checks.parse_checkov(text) == [checks.Finding("checkov", "CKV_GCP_6", "google_sql_database_instance.main",
                                                             "infra/database.tf", "SSL")]


def test_every_accepted_finding_has_a_reason_and_names_a_file_and_resource_that_exist():
    baseline = checks.load_baseline()
    assert baseline
    tf = Terraform()
    for entry in baseline:
        assert len(entry.reason) > 40, f"{entry.check}: say why it is accepted"
        assert (PROJECT_ROOT / entry.file).is_file(), entry
        if entry.file.startswith("infra/") and entry.file.endswith(".tf"):
            kind, name = entry.resource.split(".")
            assert (kind, name) in tf.resources, f"{entry.check}: no {entry.resource} in infra/ any more"


def test_a_baseline_entry_without_a_reason_is_refused(tmp_path):
    path = tmp_path / "baseline.toml"
    path.write_text('[[accepted]]\ncheck = "CKV_GCP_6"\nresource = "x.y"\nfile = "infra/database.tf"\nreason = " "\n')
    with pytest.raises(ValueError, match="reason"):
        checks.load_baseline(path)


@pytest.mark.parametrize("script", ["checks.py", "smoke.py", "traffic.py", "test_step.py", "lock_hashes.py"])
def test_the_release_commands_need_only_the_standard_library(script):
    # -I: no site-packages, no environment, no current directory; what Cloud Build's images have.
    done = subprocess.run(["/usr/bin/python3", "-I", str(RELEASE / script), "--help"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_the_smoke_looks_for_every_package_the_runtime_lock_keeps_out():
    top_levels = importlib.metadata.packages_distributions()
    for distribution in NEVER_AT_RUNTIME:
        modules = {module for module, owners in top_levels.items() if distribution in {o.lower() for o in owners}}
        modules = {m for m in modules if not m.startswith("_")}
        if not modules:
            continue  # not installed here (the emulator's own venv, the checks' tools)
        assert modules & set(smoke.DEV_MODULES), f"the smoke does not look for {distribution} ({sorted(modules)})"


def test_the_smoke_hardens_every_role_as_the_issue_and_cloud_run_require():
    running = smoke.Smoke(engine="/usr/bin/podman", image="x", network="host", database_url="", env_for_engine={})
    flags = running.hardened()
    assert "--read-only" in flags and "--cap-drop=all" in flags
    assert flags[flags.index("--security-opt") + 1] == "no-new-privileges"
    assert smoke.MAX_IMAGE_MB <= 250, "the measured 240 MB and a little room (docs/OPERATIONS.md)"


def test_the_smoke_makes_its_database_url_from_the_administrative_one_and_never_prints_a_password():
    assert smoke.database_url_for("postgresql://postgres@127.0.0.1:5432/postgres?sslmode=disable", "smoke_x") == (
        "postgresql://postgres@127.0.0.1:5432/smoke_x?sslmode=disable")
    assert smoke.redact("postgresql://app:hunter2@db:5432/postgres") == "postgresql://app:***@db:5432/postgres"


def test_ci_runs_the_static_checks_before_the_suite_and_the_smoke_is_left_to_the_release():
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip().startswith("./dev")]
    assert commands == ["./dev check", "./dev test", "./dev tck"]  # the conformance kit after the suite (issue 43)


def test_the_smoke_builds_on_local_bases_under_the_dockerfiles_own_pinned_references():
    from tests.deploy.manifests import dockerfile_stages

    stages = dockerfile_stages()
    assert smoke.pinned_bases() == {"builder": stages[0].base, "runtime": stages[-1].base}


def test_the_smokes_http2_probe_tells_a_grpc_server_from_an_http1_one():
    import http.server
    import threading
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    http1 = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=http1.serve_forever, daemon=True).start()
    try:
        assert smoke.speaks_http2("127.0.0.1", grpc_port)
        assert not smoke.speaks_http2("127.0.0.1", http1.server_address[1])
    finally:
        server.stop(None)
        http1.shutdown()
        http1.server_close()


def test_the_smokes_otlp_receiver_keeps_what_the_services_exporter_sends_and_answers_it():
    import urllib.error
    import urllib.request

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    assert smoke.receiver_host("host") == "127.0.0.1"
    finished = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(finished))
    with provider.get_tracer("smoke-test").start_as_current_span("a request"):
        pass
    with smoke.OtlpReceiver("127.0.0.1") as receiver:
        exporter = OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces", timeout=5)
        assert exporter.export(finished.get_finished_spans()) == SpanExportResult.SUCCESS
        assert receiver.wait_for("/v1/traces", timeout_s=5) == [smoke.OTLP_CONTENT_TYPE]
        assert receiver.wait_for("/v1/metrics", timeout_s=0.1) == []
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(f"{receiver.url}/v1/logs", data=b"x"), timeout=5)
        assert refused.value.code == 404
        assert receiver.posts("/v1/logs") == []


def test_the_local_test_step_runs_exactly_the_release_steps_script():
    import yaml

    sys.path.insert(0, str(RELEASE))
    try:
        import test_step
    finally:
        sys.path.remove(str(RELEASE))
    step = next(s for s in yaml.safe_load((RELEASE.parents[1] / "cloudbuild.yaml").read_text())["steps"] if s["id"] == "test")
    assert step["entrypoint"] == "tini" and step["args"][:3] == ["--", "bash", "-c"]  # the script under tini, as here
    assert test_step.cloudbuild_test_script() == step["args"][3].replace("${_RELEASE}", "local")
    assert test_step.cloudbuild_test_script().rstrip().endswith("./dev test")
