"""A model provider of the example plugin: ``{"provider": "echo", "prefix": "..."}``
answers every turn with the prefix and the run's input."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.models.base import ModelRequest, ModelResponse, Usage


class EchoModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["echo"]
    prefix: str = Field(default="you said: ", max_length=200)


class EchoModel:
    def __init__(self, config: EchoModelConfig) -> None:
        self.config = config

    def complete(self, request: ModelRequest) -> ModelResponse:
        said = next((m.content for m in reversed(request.messages) if m.role == "user"), "") or ""
        return ModelResponse(content=self.config.prefix + said, usage=Usage(input_tokens=len(said), output_tokens=1))
