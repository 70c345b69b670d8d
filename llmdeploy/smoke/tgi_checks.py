"""Checks through TGI's protocol with the `huggingface_hub` InferenceClient, as TGI users call it.

`chat_completion` goes to `<url>/v1/chat/completions`; streamed `text_generation` goes to TGI's
`/generate_stream` route. huggingface_hub is imported only here, and only when an endpoint speaks TGI.
"""

from __future__ import annotations

import httpx

from llmdeploy.smoke.openai_checks import HELLO, CheckFailed


def tgi_info(client: httpx.Client, base_url: str) -> dict[str, object] | None:
    """TGI's /info, or None when the endpoint does not speak TGI (vLLM answers 404)."""
    try:
        response = client.get(base_url + "/info")
        data = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return data if isinstance(data, dict) and "model_id" in data else None


def _client(url: str, api_key: str | None, timeout_s: float) -> object:
    try:
        from huggingface_hub import InferenceClient
    except ImportError as e:
        raise CheckFailed("huggingface_hub is not installed (pip install huggingface_hub)") from e
    return InferenceClient(model=url, api_key=api_key, timeout=timeout_s)


def hub_chat_completion(base_url: str, model: str, api_key: str | None, timeout_s: float) -> str:
    client = _client(base_url, api_key, timeout_s)
    try:
        out = client.chat_completion(messages=HELLO, model=model, max_tokens=16, temperature=0.0)  # type: ignore[attr-defined]
    except Exception as e:  # huggingface_hub raises its own hierarchy plus httpx/requests errors
        raise CheckFailed(f"InferenceClient.chat_completion: {type(e).__name__}: {str(e)[:160]}") from e
    content = out.choices[0].message.content if out.choices else None
    if not isinstance(content, str) or not content.strip():
        raise CheckFailed("InferenceClient.chat_completion: empty message content")
    return content


def hub_text_generation_stream(base_url: str, api_key: str | None, timeout_s: float) -> str:
    client = _client(base_url + "/generate_stream", api_key, timeout_s)
    pieces: list[str] = []
    try:
        for token in client.text_generation(  # type: ignore[attr-defined]
            "The capital of France is", max_new_tokens=8, stream=True, details=True
        ):
            if token.token is not None and not token.token.special:
                pieces.append(token.token.text)
            last = token
    except Exception as e:  # see above
        raise CheckFailed(
            f"InferenceClient.text_generation(stream=True): {type(e).__name__}: {str(e)[:160]}"
        ) from e
    if not pieces:
        raise CheckFailed("InferenceClient.text_generation(stream=True): no tokens streamed")
    if getattr(last, "generated_text", None) is None:
        raise CheckFailed("InferenceClient.text_generation(stream=True): last event has no generated_text")
    return "".join(pieces)
