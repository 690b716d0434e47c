"""The model names every subcommand accepts: one registry.

    tiny                  the embedded tiny Falcon-H1 (2 layers, fp32; weights are built from a
                          seed on first use). Served by `run`, `continuation`, `demo`; priced by
                          `plan` and `storage`.
    falcon-h1-7b          architecture-only configs shipped in hybridmem/sim/configs (no weights;
    granite-4.0-h-micro   SOURCES.md there cites every number). Priced by `plan` and `storage`,
    nemotron-h-8b         simulated by `sim`; the serving commands refuse them by name.
    PATH                  a config.json or a model directory holding one (a served model needs
                          its weights there too).

Every command resolves ``--model`` here, so a name one command knows is never "unknown" to another:
where a command cannot use it, the refusal says why and which command can.

Defaults shared by `run`, `sim` and `continuation` (and `demo`) also live here, one set:

    --org     S2 (shared paging with conv slots in slabs); `--org vllm` is vLLM's own manager
    --budget  b40 for the tiny model (110 pages of 64 tokens under S1/S2: requests compete and
              cached prefixes are reclaimed), b63 for any other model (the paper's main point)
    --cap     8 running sequences for the tiny model (a CPU), 63 for any other (the paper's)

"The tiny model" is the name `tiny` or a directory `hybridmem model build` wrote (its
hybridmem.json says so).

`continuation` alone keeps a larger default budget (b1536): a continuation check compares a
retained checkpoint with recomputation, so no reclaim may remove the checkpoint mid-check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from hybridmem.errors import HybridMemError
from hybridmem.geometry import SHIPPED, Geometry, geometry_from_config, load_geometry
from hybridmem.inputs import read_input_text

if TYPE_CHECKING:
    from hybridmem.units import Units

TINY = "tiny"
DEFAULT_ORG = "S2"
ORG_CHOICES = ("vllm", "S0", "S1", "S2", "D0")  # == hybridmem.sim.schedulers.ORGS (a test says so)
# == hybridmem.sim.schedulers.CHUNKINGS / DEFAULT_CHUNKING, spelled out so --help imports no vLLM
CHUNKING_CHOICES = ("interval", "block", "grid512", "budget")
DEFAULT_CHUNKING = "interval"


def is_tiny(model: str) -> bool:
    """The tiny model by name, or a directory `hybridmem model build` wrote (its hybridmem.json)."""
    if model == TINY:
        return True
    try:
        meta = json.loads(read_input_text(Path(model) / "hybridmem.json", "model stamp"))
    except (HybridMemError, ValueError, RecursionError):
        return False
    return isinstance(meta, dict) and meta.get("format") == "hybridmem-model"


def default_budget(model: str) -> str:
    return "b40" if is_tiny(model) else "b63"


def default_cap(model: str) -> int:
    return 8 if is_tiny(model) else 63


def names() -> tuple[str, ...]:
    return (TINY, *SHIPPED)


def help_text(default: str | None = None) -> str:
    tail = f" (default {default})" if default else ""
    return (f"{', '.join(names())}, a config.json or a model directory{tail}; "
            "`hybridmem plan --help` lists what each name is")


def geometry(model: str, ssm_dtype: str | None = None) -> Geometry:
    """The state geometry of a name or path (``tiny`` from its config, no build needed)."""
    if model == TINY:
        from hybridmem.engines.tiny_model import config_kwargs

        cfg = {**config_kwargs(), "model_type": "falcon_h1"}
        return geometry_from_config(cfg, name=TINY, ssm_dtype=ssm_dtype)
    return load_geometry(model, ssm_dtype=ssm_dtype)


def grid_tokens(model: str) -> int | None:
    """The organization grid a name is served on (``None``: the default, 512 tokens)."""
    from hybridmem.engines.tiny_model import TINY_GRID_TOKENS, grid_tokens

    if model == TINY:
        return TINY_GRID_TOKENS
    if Path(model).is_dir():
        try:
            return grid_tokens(model)  # what the model declares in hybridmem.json
        except ValueError as exc:
            raise HybridMemError(str(exc)) from None
    return None


def units(model: str, ssm_dtype: str | None = None) -> Units:
    """The allocation units of a name or path at the grid it is served on (every command's
    one derivation; D0's 16-token unit and interval are fields of the same units)."""
    from hybridmem.units import derive_units

    geo = geometry(model, ssm_dtype=ssm_dtype)
    grid = grid_tokens(model)
    return derive_units(geo) if grid is None else derive_units(geo, grid)


def served(model: str, command: str) -> str:
    """``model`` for a command that serves it on vLLM: ``tiny`` or a model directory."""
    if model in SHIPPED:
        raise HybridMemError(
            f"model {model!r} is an architecture-only config (no weights): `{command}` serves "
            f"'{TINY}' or a model directory with weights; price it with `hybridmem plan --model "
            f"{model}` or simulate it with `hybridmem sim --model {model}`")
    if model != TINY and not (Path(model) / "config.json").is_file():
        raise HybridMemError(f"model {model!r}: not one of {', '.join(names())} and no "
                             "config.json there (a model directory)")
    return model


def simulated(model: str) -> str:
    """``model`` for `sim`: a shipped name or a config (the tiny model is served for real)."""
    if model == TINY:
        raise HybridMemError(
            f"model {TINY!r} is served for real on the CPU by `hybridmem run --model {TINY}`; "
            f"`sim` prices production-size models on a GPU preset: {', '.join(SHIPPED)} or a "
            "config.json")
    return model
