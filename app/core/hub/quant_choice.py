"""Which model of a repo `REPO:QUANT` or `--file NAME` means.

File names are read by the search's own rules (search_files: quants, split parts, projectors
left out), so a quant the search shows is a quant the pull finds.
"""

from __future__ import annotations

from kvscope.app.core.hub.errors import PullError
from kvscope.app.core.hub.search_files import ModelFiles, quant_of

# llama.cpp's `-hf repo` takes these, in this order, when no quant is named.
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")


def choose_model(
    repo: str, models: list[ModelFiles], quant: str | None, file: str | None
) -> ModelFiles:
    """The model meant; PullError in words when there is none (listing what there is)."""
    if not models:
        raise PullError(f"{repo} has no GGUF model files.")
    quants = sorted({q for m in models if (q := quant_of(m.path)) is not None})
    if file is not None:
        for model in models:
            if file in (part.path for part in model.parts):
                return model
        names = ", ".join(m.path for m in models)
        raise PullError(f"{repo} has no model file {file}. Its GGUF models: {names}.")
    if quant is not None:
        wanted = quant.upper()
        for model in models:
            if quant_of(model.path) == wanted:
                return model
        there = ", ".join(quants) if quants else "none named in the file names"
        raise PullError(f"{repo} has no {wanted} quant. The quants there are: {there}.")
    for default in DEFAULT_QUANTS:
        for model in models:
            if quant_of(model.path) == default:
                return model
    if len(models) == 1:
        return models[0]
    if not quants:
        names = ", ".join(m.path for m in models)
        raise PullError(f"{repo} has several GGUF models; pick one with --file: {names}.")
    raise PullError(
        f"{repo} has neither {' nor '.join(DEFAULT_QUANTS)}: name one, as {repo}:QUANT."
        f" The quants there are: {', '.join(quants)}."
    )
