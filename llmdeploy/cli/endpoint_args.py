"""Options shared by `smoke` and `bench`: an endpoint given by a recipe or by --url alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import click
import httpx

from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import Recipe

F = TypeVar("F", bound=Callable[..., object])


def endpoint_options(command: F) -> F:
    decorators = [
        click.argument("recipe_path", metavar="[RECIPE]", required=False, type=click.Path(dir_okay=False)),
        click.option(
            "--url", help="Endpoint base URL, e.g. http://127.0.0.1:8000 (default: the recipe's server)."
        ),
        click.option("--model", help="Model name to request (default: the recipe's, else the first served)."),
        click.option(
            "--api-key",
            envvar="LLMDEPLOY_API_KEY",
            help="Bearer token (env LLMDEPLOY_API_KEY; default: the recipe's).",
        ),
        click.option(
            "--set", "overrides", multiple=True, metavar="PATH=VALUE", help="Override a recipe field."
        ),
    ]
    for decorator in reversed(decorators):
        command = decorator(command)
    return command


@dataclass(frozen=True)
class Endpoint:
    url: str
    model: str | None
    api_key: str | None
    recipe: Recipe | None


def resolve_endpoint(
    recipe_path: str | None,
    url: str | None,
    model: str | None,
    api_key: str | None,
    overrides: tuple[str, ...],
) -> Endpoint:
    from llmdeploy.smoke.runner import api_key_from_recipe

    if recipe_path is None and url is None:
        raise click.UsageError("give a RECIPE or --url")
    if recipe_path is None and overrides:
        raise click.UsageError("--set needs a RECIPE")
    recipe = None
    if recipe_path is not None:
        from llmdeploy.recipe import load_recipe

        recipe = load_recipe(recipe_path, overrides)
        if url is None:
            from llmdeploy.targets import Cluster, get_target

            # the target knows where it answers (a platform states it in its object's status)
            url = get_target(recipe.target.type).endpoint_url(recipe, Cluster())
        model = model or recipe.server.served_model_name or recipe.model.id
        api_key = api_key or api_key_from_recipe(recipe)
    assert url is not None
    if not url.startswith(("http://", "https://")):
        raise UserError.one("the URL needs a scheme", path="--url", value=url, fix=f"use http://{url}")
    return Endpoint(url.rstrip("/"), model, api_key, recipe)


def first_served_model(url: str, api_key: str | None) -> str:
    """The first id of GET /v1/models; a clear error when the endpoint cannot be reached."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url + "/v1/models", headers=headers, timeout=30.0)
        entries = response.json().get("data") if response.status_code == 200 else None
    except httpx.HTTPError as e:
        raise UserError.one(
            f"cannot reach {url} ({type(e).__name__})", path="--url", fix="start the server, or check --url"
        ) from e
    except ValueError:
        entries = None
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        raise UserError.one(f"{url}/v1/models lists no model", path="--model", fix="give --model NAME")
    return str(entries[0].get("id"))
