"""The HTTP errors of `ortformer serve`, with text-embeddings-inference 1.9's codes and types.

TEI answers every error with a JSON body ``{"error": message, "error_type": type}`` (the
OpenAI route with ``{"message", "code", "type"}``) and maps its error types to statuses
(router/src/http/server.rs, ``From<&ErrorType> for StatusCode``):

    validation  422  a body that is not the route's request, too many inputs
                     (--max-client-batch-size), an input longer than the model takes without
                     truncate, an unknown prompt name, a field out of range
    empty       400  an empty batch or an empty text
    tokenizer   422  the tokenizer failed
    overloaded  429  the model is full (--max-concurrent-requests)
    backend     424  the model failed, or cannot serve the route (/rerank on an embedder)
    unhealthy   503  /health while a model's worker is down

Beyond TEI's types: a body over --payload-limit is 413 "validation" (TEI's body limit answers
413), a missing or wrong API key 401 "unauthorized", an unknown route or method 404 / 405
"validation", and a bug 500 "backend" carrying the request id that the log names.
"""
from __future__ import annotations

from ..core.errors import OrtformerError

STATUS = {"validation": 422, "empty": 400, "tokenizer": 422, "overloaded": 429, "backend": 424,
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


def validation(message: str, failure: str = "validation") -> ServeError:
    """One of TEI 1.9's validation errors (a body that is not the route's request, a value out
    of range, too many inputs, an over-long input): 422."""
    return ServeError(message, "validation", failure=failure)


# the name the request parsers use: a body that is not the route's request
bad_request = validation


def too_large(message: str) -> ServeError:
    """A body over --payload-limit: 413, as TEI's body limit answers."""
    return ServeError(message, "validation", status=413, failure="payload_limit")


def empty(message: str) -> ServeError:
    return ServeError(message, "empty", failure="validation")


def backend(message: str, failure: str = "inference") -> ServeError:
    return ServeError(message, "backend", failure=failure)


def cannot_serve(model: str, route: str, why: str) -> ServeError:
    """A route this model cannot answer: TEI's 424 "backend" (its model_type check)."""
    return ServeError(f"model {model!r} cannot serve {route}: {why}", "backend", failure="model_type")


def overloaded(model: str, pending: int, limit: int) -> ServeError:
    return ServeError(f"model {model!r} is overloaded: {pending} requests are admitted and not yet answered "
                      f"(--max-concurrent-requests {limit}); retry later", "overloaded")


def unhealthy(model: str) -> ServeError:
    return ServeError(f"model {model!r} is not serving (shutting down, or its worker stopped)", "unhealthy")
