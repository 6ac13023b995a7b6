"""The HTTP errors of `ortformer serve`, with text-embeddings-inference's codes and types.

TEI answers every error with a JSON body ``{"error": message, "error_type": type}`` (the
OpenAI route with ``{"message", "code", "type"}``) and maps its error types to statuses
(router/src/http/server.rs, ``From<&ErrorType> for StatusCode``):

    validation  413  too many inputs (--max-client-batch-size), an input longer than the
                     model takes without truncate, an unknown prompt name
    empty       400  an empty batch or an empty input
    tokenizer   422  the tokenizer failed
    overloaded  429  the queue is full (--max-concurrent-requests)
    backend     424  the model failed, or cannot serve the route (/rerank on an embedder)
    unhealthy   503  /health while a model's worker is down

TEI's JSON extractor answers a body that is not the route's request (a missing field, a
wrong type, an unknown enum value) with 422; so does ortformer, with error_type "validation".
Beyond TEI: a body over --payload-limit is 413 "validation" (TEI's body limit sends 413 as
plain text) and a missing or wrong API key 401 "unauthorized".
"""
from __future__ import annotations

from ..errors import OrtformerError

STATUS = {"validation": 413, "empty": 400, "tokenizer": 422, "overloaded": 429, "backend": 424,
          "unhealthy": 503, "unauthorized": 401}


class ServeError(OrtformerError):
    """A request the server answers with an error: ``status`` and TEI's ``error_type``."""

    def __init__(self, message: str, error_type: str, status: int | None = None, failure: str | None = None):
        super().__init__(message)
        self.error_type = error_type
        self.status = STATUS[error_type] if status is None else status
        # the te_request_failure{err=...} label TEI counts it under
        self.failure = failure or error_type

    def body(self) -> dict:
        return {"error": str(self), "error_type": self.error_type}

    def openai_body(self) -> dict:
        """TEI's OpenAI-compatible error (OpenAICompatErrorResponse)."""
        return {"message": str(self), "code": self.status, "type": self.error_type}


def bad_request(message: str) -> ServeError:
    """A body that is not the route's request: 422, as TEI's JSON extractor answers."""
    return ServeError(message, "validation", status=422, failure="validation")


def validation(message: str, failure: str = "validation") -> ServeError:
    """One of TEI's validation errors: 413."""
    return ServeError(message, "validation", failure=failure)


def empty(message: str) -> ServeError:
    return ServeError(message, "empty", failure="validation")


def backend(message: str, failure: str = "inference") -> ServeError:
    return ServeError(message, "backend", failure=failure)


def cannot_serve(model: str, route: str, why: str) -> ServeError:
    """A route this model cannot answer: TEI's 424 "backend" (its model_type check)."""
    return ServeError(f"model {model!r} cannot serve {route}: {why}", "backend", failure="model_type")
