"""Where a checkpoint's recurrent state is read from and corrupted: vLLM's rows or an org's pages.

Both readers take a Mamba-group *block id* (what the request's block table holds at position
``b / G - 1``) and give the same :class:`StateBytes`: every Mamba layer's conv state and SSM state
flattened in vLLM's row-major layout and concatenated in layer-name order, in the dtypes the
engine stores them in. So a state read through an organization compares element by element with
one read from vLLM's rows::

    --org vllm     VllmRows   block id -> row ``block id`` of each layer's (conv, ssm) cache
    --org S0..D0   OrgStore   block id -> StateTable.resolve -> StateAddress(members, conv)
                              -> each layer's LayerStore.gather (the worker's own copy path):
                                 S1/S2: SSM bytes [jP, (j+1)P) from member page j, conv from
                                 its page (S1) or slot line (S2); S0/D0: one page, conv inside

Two reads per checkpoint, so that a wrong *read path* cannot hide behind a consistent one:

* ``read``: the bytes as the worker's read path returns them (``LayerStore.gather``, the copy
  the model's forward continues from) -- used for the state a consumer *adopts*;
* ``read_stored``: the bytes as stored, decoded from the raw pages by the layout above without
  ``gather`` -- used for the states computed at b (producer, split arm): what the forward wrote.

Without a fault both agree bit for bit; under ``swap-members`` (reads take member pages 0 and 1
swapped) ``read`` differs from ``read_stored`` on every S1/S2 checkpoint. For ``--org vllm``
both are the row.

``VllmRows.write`` puts a given state into a row: the ``--org vllm`` fault controls
"fresh-slot" and "boundary-shift" (``continuation_checks/run.py``).

``corrupt`` is the fault control "corrupt-checkpoint": SSM x scale + 1, conv negated, written
back in place (vLLM's rows; for an organization through ``LayerStore.scatter`` to the same
address), so the next reader of that checkpoint -- the adopting consumer -- continues from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridmem.errors import HybridMemError


@dataclass(frozen=True)
class StateBytes:
    """A checkpoint's recurrent state, every Mamba layer concatenated (layer order fixed)."""

    conv: Any  # torch.Tensor, flat
    ssm: Any   # torch.Tensor, flat


def mamba_layers(model_runner: Any) -> list[tuple[str, Any]]:
    """(name, layer) of every Mamba mixer in the runner's forward context, in name order."""
    ctx = model_runner.vllm_config.compilation_config.static_forward_context
    out = [(n, m) for n, m in ctx.items()
           if isinstance(getattr(m, "kv_cache", None), (tuple, list)) and len(m.kv_cache) == 2]
    if not out:
        raise HybridMemError("no Mamba layer with a (conv, ssm) state cache in this model")
    return sorted(out, key=lambda nm: nm[0])


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


class VllmRows:
    """State storage of ``--org vllm``: row ``block_id`` of each Mamba layer's conv / SSM cache."""

    def __init__(self, model_runner: Any) -> None:
        self.layers = mamba_layers(model_runner)

    def dtypes(self) -> dict[str, str]:
        """The storage dtypes of the conv and SSM state (what bf16/fp32 runs really hold)."""
        _, m = self.layers[0]
        return {"conv": _name(m.kv_cache[0].dtype), "ssm": _name(m.kv_cache[1].dtype)}

    def read(self, block_id: int) -> StateBytes:
        import torch

        if block_id <= 0:
            raise ValueError(f"block id {block_id} is vLLM's null block (or negative)")
        conv = [m.kv_cache[0][block_id].reshape(-1).clone() for _, m in self.layers]
        ssm = [m.kv_cache[1][block_id].reshape(-1).clone() for _, m in self.layers]
        return StateBytes(torch.cat(conv), torch.cat(ssm))

    def read_stored(self, block_id: int) -> StateBytes:
        """Same as :meth:`read`: vLLM's rows have one read path."""
        return self.read(block_id)

    def corrupt(self, block_id: int, scale: float = 4.0) -> None:
        """Fault control: overwrite the checkpoint in place (SSM x scale + 1, conv negated)."""
        if block_id <= 0:
            raise ValueError(f"block id {block_id} is vLLM's null block (or negative)")
        for _, m in self.layers:
            m.kv_cache[1][block_id].mul_(scale).add_(1.0)
            m.kv_cache[0][block_id].neg_()

    def write(self, block_id: int, state: StateBytes) -> None:
        """Fault control: put ``state`` (as :meth:`read` gives it) into row ``block_id``, so
        the next reader continues from another state: another request's (``fresh-slot``) or
        the one a block earlier (``boundary-shift``)."""
        if block_id <= 0:
            raise ValueError(f"block id {block_id} is vLLM's null block (or negative)")
        conv = ssm = 0
        for _, m in self.layers:
            c, r = m.kv_cache[0][block_id], m.kv_cache[1][block_id]
            c.copy_(state.conv[conv: conv + c.numel()].reshape(c.shape))
            r.copy_(state.ssm[ssm: ssm + r.numel()].reshape(r.shape))
            conv += c.numel()
            ssm += r.numel()


class OrgStore:
    """State storage of an organization: the checkpoint at ``StateTable.resolve(block id)``,
    gathered from / scattered to each Mamba layer's :class:`LayerStore` (the worker's own store
    for that table, :func:`hybridmem.vllm_plugin.org_state.store_for`).

    ``layers``: (name, layer) pairs with ``get_state_shape`` / ``get_state_dtype`` (conv, ssm)
    and ``kv_cache`` (for the device); ``table``: the engine's StateTable.
    """

    def __init__(self, layers: list[tuple[str, Any]], table: Any) -> None:
        if table is None:
            raise HybridMemError("organization mode is on but no StateTable is active: the "
                                 "recurrent state has no address to read")
        self.layers = layers
        self.table = table

    @classmethod
    def from_runner(cls, model_runner: Any, table: Any) -> OrgStore:
        return cls(mamba_layers(model_runner), table)

    def dtypes(self) -> dict[str, str]:
        conv, ssm = self.layers[0][1].get_state_dtype()
        return {"conv": _name(conv), "ssm": _name(ssm)}

    def _rows(self, block_id: int) -> list[tuple[Any, Any, Any, Any]]:
        """Per layer: (store, tables, byte row [1, s + c] = SSM | conv, layer)."""
        import torch

        from hybridmem.vllm_plugin.org_state import store_for
        from hybridmem.vllm_plugin.resident import flush_all

        if block_id <= 0:
            raise ValueError(f"block id {block_id} is vLLM's null block (or negative)")
        flush_all()  # rows the engine keeps resident are written to their pages first
        address = self.table.resolve(block_id)
        out = []
        for _, m in self.layers:
            store = store_for(m, self.table)
            s, c = store.sizes
            row = torch.empty(1, s + c, dtype=torch.uint8, device=store.device)
            words = store.words(row)
            sw = s // store.word
            t = store.tables([address])
            store.gather(t, words[:, :sw], words[:, sw:])
            out.append((store, t, row, m))
        return out

    @staticmethod
    def _views(row: Any, store: Any, layer: Any) -> tuple[Any, Any]:
        """(conv, ssm) typed flat views of a byte row ``[1, s + c]`` (SSM first)."""
        s, _ = store.sizes
        conv_dt, ssm_dt = layer.get_state_dtype()
        return row[0, s:].view(conv_dt), row[0, :s].view(ssm_dt)

    def read(self, block_id: int) -> StateBytes:
        import torch

        conv, ssm = [], []
        for store, _, row, m in self._rows(block_id):
            cv, sv = self._views(row, store, m)
            conv.append(cv.clone())
            ssm.append(sv.clone())
        return StateBytes(torch.cat(conv), torch.cat(ssm))

    def read_stored(self, block_id: int) -> StateBytes:
        """The checkpoint as stored: each layer's raw pages decoded by the layout (member j holds
        SSM bytes [jP, (j+1)P); conv inside the page, on its page, or at its slot line), with
        no ``gather`` in between."""
        import torch

        from hybridmem.vllm_plugin.org_state import store_for
        from hybridmem.vllm_plugin.resident import flush_all

        if block_id <= 0:
            raise ValueError(f"block id {block_id} is vLLM's null block (or negative)")
        flush_all()  # rows the engine keeps resident are written to their pages first
        a = self.table.resolve(block_id)
        conv, ssm = [], []
        for _, m in self.layers:
            store = store_for(m, self.table)
            pages, lay = store.pages, store.layout
            s, c = store.sizes
            row = torch.empty(1, s + c, dtype=torch.uint8, device=store.device)
            if lay.conv == "inside":
                row[0] = pages[a.members[0], :s + c]
            else:
                p_bytes = lay.page_bytes
                for j, page in enumerate(a.members):
                    n = min(p_bytes, s - j * p_bytes)
                    row[0, j * p_bytes:j * p_bytes + n] = pages[page, :n]
                if lay.conv == "page":
                    row[0, s:] = pages[a.conv, :c]
                else:
                    slab, k = divmod(a.conv, lay.slots_per_slab)
                    row[0, s:] = pages[slab, k * lay.slot_bytes:k * lay.slot_bytes + c]
            cv, sv = self._views(row, store, m)
            conv.append(cv.clone())
            ssm.append(sv.clone())
        return StateBytes(torch.cat(conv), torch.cat(ssm))

    def corrupt(self, block_id: int, scale: float = 4.0) -> None:
        """Fault control: the checkpoint at the block's address, SSM x scale + 1, conv negated,
        scattered back to the same member pages and conv page / line."""
        import torch

        with torch.inference_mode():  # the arenas are inference tensors (built in the forward)
            for store, t, row, m in self._rows(block_id):
                cv, sv = self._views(row, store, m)
                sv.mul_(scale).add_(1.0)
                cv.neg_()
                words = store.words(row)
                sw = store.sizes.ssm_bytes // store.word
                store.scatter(t, words[:, :sw], words[:, sw:])
