"""The dialects' request rows, checked and stored as Relay's chat request: the pure
translation is each dialect's own (:mod:`relay_batches.dialects.openai.batch_file`,
:mod:`relay_batches.dialects.anthropic.rows`); here it meets the row rules.

:func:`openai_line_row`: one line of an OpenAI Batch input file,
``{custom_id, method: "POST", url: "/v1/chat/completions", body}``, whose ``body`` is a
chat request (checked by :class:`relay_batches.dialects.chat.ChatRequest`, ``body.model``
required); a line whose ``url`` is another endpoint Relay runs (embeddings, completions,
moderations, responses) has that endpoint's body, checked by its model and stored with
its endpoint (:mod:`relay_batches.dialects.endpoints`).

:func:`anthropic_request_row`: one ``{custom_id, params}`` of an Anthropic Message
Batches create, whose ``params`` are Messages API parameters (the models below),
translated: ``system`` becomes a leading system message; text and image blocks content
parts (a base64 image a ``data:`` URL); ``tool_use`` blocks assistant ``tool_calls``
(``arguments`` the JSON text of ``input``); each ``tool_result`` block a ``tool``
message; ``tools`` function tools; ``tool_choice`` auto/any/tool/none
auto/required/function/none; ``stop_sequences`` ``stop``.

Every chat-completions field is accepted (only ``stream: true`` and ``stream_options``
are refused: batch rows are not streamed); a field one deployment cannot honour fails
that row there, naming it. What the Anthropic API allows but Relay cannot honour is
refused naming the field, never dropped: ``thinking``, ``top_k``, ``cache_control``,
documents, ``metadata`` (Relay forwards no end-user id to providers), a ``tool_result``
with ``is_error``.

Both raise ``RowRejected(RowError(index, field, message))`` with ``field`` the path in
the line (``body.messages[0].content``, ``params.messages[0].content``) and return a
:class:`RowInput` stored in object form, always with its ``model``.
"""

from __future__ import annotations

import re
from collections.abc import Container
from typing import Any

import orjson
from pydantic import ValidationError

from relay_batches.dialects.anthropic.rows import simple_translation, translate
from relay_batches.dialects.anthropic.shapes import AnthropicParams
from relay_batches.dialects.chat import (
    MAX_CUSTOM_ID_CHARS,
    ChatRequest,
    check_row,
    plain_messages,
    plain_params,
    stored_request,
)
from relay_batches.dialects.endpoints import CHAT, check_body, stored_body
from relay_batches.dialects.openai.batch_file import (
    LINE_FIELDS,
    chat_request,
    target_problem,
    unknown_field,
)
from relay_batches.dialects.shapes import (
    first_error,
    is_unicode,
    unencodable_path,
)
from relay_batches.services.ingest_api.rows.validation import (
    RowError,
    RowInput,
    RowRejected,
    SubmitLimits,
    check_unique_ids,
)

ANTHROPIC_CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_PLAIN_CHAT = frozenset({"messages", "model"})


def _reject(index: int, field: str, message: str) -> RowRejected:
    return RowRejected(RowError(index, field, message))


def _custom_id(index: int, custom_id: object, anthropic: bool) -> str:
    if type(custom_id) is not str:
        problem = "is required" if custom_id is None else "must be a string"
        raise _reject(index, "custom_id", problem)
    if anthropic and not ANTHROPIC_CUSTOM_ID.fullmatch(custom_id):
        raise _reject(index, "custom_id", "must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -")
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise _reject(index, "custom_id", f"must be at most {MAX_CUSTOM_ID_CHARS} characters")
    if "\x00" in custom_id:  # Postgres text cannot hold NUL
        raise _reject(index, "custom_id", "must not contain NUL characters")
    if not is_unicode(custom_id):  # a lone surrogate: the ledger cannot store it
        raise _reject(index, "custom_id", "must be valid Unicode text")
    return custom_id


def _object(index: int, value: object, shape: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise _reject(index, "", f"must be a JSON object {shape}")
    return value


def _chat_row(
    index: int,
    custom_id: str,
    chat: dict[str, Any],
    prefix: str,
    limits: SubmitLimits,
    known_models: Container[str],
) -> RowInput:
    """``chat`` checked by the chat request model (errors under ``prefix``) and stored."""
    model = chat.get("model")
    if model is None:
        raise _reject(index, f"{prefix}.model", "is required")
    plain = (
        plain_params(chat, _PLAIN_CHAT)
        and type(model) is str
        and model in known_models
        and plain_messages(chat.get("messages"), limits.max_content_bytes)
    )  # the common case, which the model always accepts: no need to ask it
    problem = (
        None if plain else check_row(ChatRequest, chat, limits.max_content_bytes, known_models)
    )
    if problem is not None:
        field, message = problem
        raise _reject(index, f"{prefix}.{field}" if field else prefix, message)
    try:
        # A plain chat holds no null: stored_request's text, without its copying.
        request_json = (
            orjson.dumps(chat, option=orjson.OPT_SORT_KEYS).decode()
            if plain
            else stored_request(chat)
        )
    except TypeError:  # lone surrogates: only from a payload not built by orjson
        field = unencodable_path(chat)
        raise _reject(
            index, f"{prefix}.{field}" if field else prefix, "must be valid Unicode text"
        ) from None
    return RowInput(custom_id, request_json, chat["model"])


# --- OpenAI --------------------------------------------------------------------------


def openai_line_row(
    index: int, line: object, limits: SubmitLimits, known_models: Container[str]
) -> RowInput:
    """One decoded line of an OpenAI Batch input file, as a row (module docstring)."""
    line = _object(index, line, "{custom_id, method, url, body}")
    if (unknown := unknown_field(line)) is not None:
        known = ", ".join(LINE_FIELDS)
        raise _reject(index, unknown, f"is not a field of a batch line (fields: {known})")
    custom_id = _custom_id(index, line.get("custom_id"), anthropic=False)
    if (problem := target_problem(line)) is not None:
        raise _reject(index, *problem)
    if line["url"] != CHAT:
        return _body_row(index, custom_id, line["url"], line["body"], known_models)
    chat = chat_request(line["body"])
    return _chat_row(index, custom_id, chat, "body", limits, known_models)


def _body_row(
    index: int, custom_id: str, endpoint: str, body: dict[str, Any], known: Container[str]
) -> RowInput:
    """A line's ``body`` of ``endpoint`` (embeddings, …), checked by its model and
    stored with its endpoint (:func:`relay_batches.dialects.endpoints.stored_body`)."""
    if body.get("model") is None:
        raise _reject(index, "body.model", "is required")
    problem = check_body(endpoint, body, known)
    if problem is not None:
        field, message = problem
        raise _reject(index, f"body.{field}" if field else "body", message)
    try:
        request_json = stored_body(endpoint, body)
    except TypeError:  # lone surrogates: only from a payload not built by orjson
        field = unencodable_path(body)
        raise _reject(
            index, f"body.{field}" if field else "body", "must be valid Unicode text"
        ) from None
    return RowInput(custom_id, request_json, body["model"], endpoint)


# --- Anthropic -----------------------------------------------------------------------


def anthropic_request_row(
    index: int, request: object, limits: SubmitLimits, known_models: Container[str]
) -> RowInput:
    """One ``{custom_id, params}`` of an Anthropic batch, as a row (module docstring)."""
    request = _object(index, request, "{custom_id, params}")
    for key in request:
        if key not in ("custom_id", "params"):
            known = "custom_id, params"
            raise _reject(index, str(key), f"is not a field of a request (fields: {known})")
    custom_id = _custom_id(index, request.get("custom_id"), anthropic=True)
    params = request.get("params")
    if type(params) is not dict:
        raise _reject(index, "params", "is required" if params is None else "must be an object")
    chat = simple_translation(params)
    if chat is None:
        try:
            AnthropicParams.model_validate(params)
        except ValidationError as exc:
            field, message = first_error(exc, params)
            raise _reject(index, f"params.{field}" if field else "params", message) from None
        chat = translate(params)
    return _chat_row(index, custom_id, chat, "params", limits, known_models)


__all__ = ["anthropic_request_row", "check_unique_ids", "openai_line_row"]
