"""deploy/kubernetes: every manifest is valid against the Kubernetes API schemas (the
kubernetes-validate package bundles them; strict: no unknown field), every container has a
readiness and a liveness probe, the disruption budgets and the autoscaler point at the
Deployments they are meant for, and the Secret holds placeholders only."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.cli.main import parse

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"  # the oldest minor still supported upstream when written
PROCESSES = {"worker", "beat", "api", "webhooks", "flower"}


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((KUBE / "kustomization.yaml").read_text())  # type: ignore[no-any-return]


def documents() -> list[dict[str, Any]]:
    return [
        doc
        for name in kustomization()["resources"]
        for doc in yaml.safe_load_all((KUBE / name).read_text())
        if doc is not None
    ]


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in documents() if doc["kind"] == kind}


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


def test_kustomization_lists_every_manifest() -> None:
    listed = set(kustomization()["resources"])
    assert listed == {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}


def test_every_manifest_is_valid_for_the_kubernetes_api() -> None:
    try:
        import kubernetes_validate
    except ImportError:
        message = "kubernetes-validate is not installed (pip install kubernetes-validate; `make install` does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    for doc in documents():
        # Raises kubernetes_validate.ValidationError, naming the field, on a bad manifest.
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_deployment_per_process_each_running_its_aidawork_command() -> None:
    deployments = of_kind("Deployment")
    assert set(deployments) == {f"aidawork-{p}" for p in PROCESSES}
    for name, deployment in deployments.items():
        spec = deployment["spec"]
        assert spec["selector"]["matchLabels"].items() <= pod_labels(deployment).items(), name
        (container,) = spec["template"]["spec"]["containers"]
        assert parse(container["args"]).name == name.removeprefix("aidawork-")


def test_every_container_has_a_readiness_and_a_liveness_probe() -> None:
    for name, deployment in of_kind("Deployment").items():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert "readinessProbe" in container, name
            assert "livenessProbe" in container, name


def test_worker_is_ready_when_it_answers_a_ping_and_alive_while_it_serves_metrics() -> None:
    (container,) = of_kind("Deployment")["aidawork-worker"]["spec"]["template"]["spec"]["containers"]
    assert "inspect ping --destination aidawork@$HOSTNAME" in container["readinessProbe"]["exec"]["command"][-1]
    assert container["livenessProbe"]["httpGet"]["path"] == "/metrics"
    api = of_kind("Deployment")["aidawork-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_a_worker_has_longer_than_a_round_to_finish_it() -> None:
    from runtime.config import Policy

    spec = of_kind("Deployment")["aidawork-worker"]["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] > 2 * Policy().model_timeout_s


def test_disruption_budgets_select_the_worker_and_api_pods() -> None:
    deployments = of_kind("Deployment")
    budgets = of_kind("PodDisruptionBudget")
    assert set(budgets) == {"aidawork-worker", "aidawork-api"}
    for name, budget in budgets.items():
        selector = budget["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels(deployments[name]).items(), name
        others = [n for n, d in deployments.items() if n != name and selector.items() <= pod_labels(d).items()]
        assert others == [], name


def test_worker_autoscaler_scales_on_a_metric_the_code_exports() -> None:
    (hpa,) = of_kind("HorizontalPodAutoscaler").values()
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "aidawork-worker")
    (metric,) = hpa["spec"]["metrics"]
    name = metric["external"]["metric"]["name"]
    source = (ROOT / "worker" / "ops" / "observability" / "metrics.py").read_text()
    assert f'"{name}"' in source
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {"status": "queued"}


def test_every_setting_referenced_is_a_setting_and_secrets_are_placeholders() -> None:
    from worker.ops.settings import ENV_PREFIX, Settings

    (config,) = of_kind("ConfigMap").values()
    (secret,) = of_kind("Secret").values()
    known = {ENV_PREFIX + field.upper() for field in Settings.model_fields}
    for key in (*config["data"], *secret["stringData"]):
        assert key in known, key
    for key, value in secret["stringData"].items():
        assert "REPLACE_ME" in value, key
    assert not re.search(r"\bsk-[A-Za-z0-9]", (KUBE / "secret.yaml").read_text())
