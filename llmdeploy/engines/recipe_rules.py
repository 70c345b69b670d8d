"""What the recipe's engine can honour, as `validate` reports it: the engine's own rules plus the
draft-model requirements every engine shares (the draft shares the vocabulary, and is smaller)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

from llmdeploy.catalog import ModelSpec, resolve_model
from llmdeploy.engines.registry import get_engine
from llmdeploy.errors import Problem, UserError

if TYPE_CHECKING:  # the recipe models (pydantic) stay unimported: `plan --model` needs none
    from llmdeploy.recipe.schema import Recipe


def engine_support_problems(recipe: Recipe, model: ModelSpec) -> Iterator[Problem]:
    yield from get_engine(recipe.engine.type).support_problems(recipe, model)


def speculative_problems(recipe: Recipe, model: ModelSpec) -> Iterator[Problem]:
    spec = recipe.speculative
    if spec is None:
        return
    own = list(get_engine(recipe.engine.type).speculative_problems(recipe))
    if own:
        yield from own
        return
    if spec.method == "draft" and spec.draft_model:
        try:
            draft = resolve_model(spec.draft_model)
        except UserError as e:
            yield from (dataclasses.replace(p, path="speculative.draft_model") for p in e.problems)
            return
        if draft.vocab_size != model.vocab_size:
            yield Problem(
                f"the draft model's vocabulary ({draft.vocab_size:,} tokens) differs from the target's "
                f"({model.vocab_size:,}); draft and target must share a tokenizer",
                path="speculative.draft_model",
                value=spec.draft_model,
                has_value=True,
                fix="pick a smaller model of the same family as the draft",
            )
        if draft.num_params >= model.num_params:
            yield Problem(
                f"the draft model ({draft.num_params / 1e9:.1f}B parameters) is not smaller than the target "
                f"({model.num_params / 1e9:.1f}B); speculation would only slow decoding down",
                path="speculative.draft_model",
                value=spec.draft_model,
                has_value=True,
                fix="pick a much smaller model of the same family",
            )
