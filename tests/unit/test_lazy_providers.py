"""The official SDKs are imported when a run first needs one, not when a worker, the API or
the CLI starts: they cost more to import than the rest of the process together."""

from __future__ import annotations

import subprocess
import sys

from runtime.config import OpenAIModelConfig
from runtime.deps import default_model_providers
from runtime.models.keys import ModelKeys
from tests.support.env import REPO

SDKS = ("openai", "anthropic")


def test_starting_a_process_imports_no_provider_sdk() -> None:
    code = (
        "import sys, worker.cli.main, worker.engine.tasks, worker.api.app, worker.engine.bootstrap\n"
        f"print(','.join(m for m in {SDKS!r} if m in sys.modules) or 'none')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "none"


def test_a_lazy_provider_builds_the_real_client_on_first_use() -> None:
    from pydantic import SecretStr

    provider = default_model_providers(ModelKeys(openai=SecretStr("sk-test")))["openai"]
    assert repr(provider) == "OpenAIProvider()"
    config = OpenAIModelConfig(provider="openai", name="gpt-test", max_completion_tokens=16)
    model = provider(config, "team-a")
    assert type(model).__name__ == "OpenAICompatModel"
    assert "openai" in sys.modules
