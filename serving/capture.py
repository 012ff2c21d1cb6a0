"""Hidden-state capture: forward hooks on the residual stream and the safetensors spool writer.

Layer id 0 is the input of the first decoder layer (the token embedding, scaled where the model
scales it, as Gemma does); layer id k (1..N) is the output of decoder layer k, i.e. the residual
stream BEFORE the final norm. These are transformers' own definitions of ``output_hidden_states``
for ids 0..N-1 (its last entry is after the final norm). The decoder layers are found on the
model's base model (``model.model.layers``, ``model.gpt_neox.layers``, ``model.transformer.h``).

The file format is the one of vLLM's ``ExampleHiddenStatesConnector`` (docs/contracts.md):
``hidden_states`` ``[num_tokens, num_layer_ids, hidden]`` in the model dtype and ``token_ids``
``[num_tokens]`` int64, written to a temporary name and renamed into place; the metadata's
``row0`` is the position of row 0 (a request's ``hallulog_capture_rows`` keeps fewer positions
than all, ``contracts/capture_rows.py``). Like vLLM's
connector, ``PATH.lock`` is created next to it and held with ``flock(LOCK_EX)`` while the file is
written, so readers that follow vLLM's protocol (``flock(LOCK_SH)`` on ``PATH.lock``, read, delete
both) work unchanged. Here the file is complete before the response is sent; neither file is ever
deleted by the server.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import uuid
from collections.abc import Sequence

import torch
from hallulog.contracts.capture_rows import ROW0_KEY
from safetensors.torch import save_file


def decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    """The decoder layers of a causal LM: ``layers`` or ``h`` of its base model."""
    bases = [getattr(model, "base_model", None), getattr(model, "model", None), model]
    for base in bases:
        layers = getattr(base, "layers", None) or getattr(base, "h", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers):
            return layers
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


def num_layer_ids(model: torch.nn.Module) -> int:
    """How many layer ids a capture has at most: the first layer's input plus every layer."""
    return len(decoder_layers(model)) + 1


def parse_layer_ids(spec: str | None, total: int) -> list[int]:
    """``"0,5,30"`` → ``[0, 5, 30]`` (order kept); None or empty → all ids ``0..total-1``."""
    if not spec:
        return list(range(total))
    try:
        ids = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"capture layers must be comma-separated integers, got {spec!r}") from None
    bad = [i for i in ids if not 0 <= i < total]
    if bad or not ids:
        raise ValueError(f"capture layer ids must be in 0..{total - 1}, got {spec!r}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"capture layer ids repeat: {spec!r}")
    return ids


class HiddenStateRecorder:
    """Records the selected layer outputs of every forward pass while armed.

    ``arm()`` before a forward pass, ``collect()`` after it returns ``[batch, seq, layers, hidden]``
    (layers in the order of ``layer_ids``). While disarmed the hooks cost one attribute check.
    """

    def __init__(self, model: torch.nn.Module, layer_ids: Sequence[int]):
        layers = decoder_layers(model)
        self.layer_ids = list(layer_ids)
        self._slot = {layer_id: i for i, layer_id in enumerate(self.layer_ids)}
        self._outputs: list[torch.Tensor | None] = [None] * len(self.layer_ids)
        self._armed = False
        self._handles = [
            layers[0].register_forward_pre_hook(self._input_hook(), with_kwargs=True)
            if layer_id == 0
            else layers[layer_id - 1].register_forward_hook(self._hook(layer_id))
            for layer_id in self.layer_ids
        ]

    def _hook(self, layer_id: int):
        slot = self._slot[layer_id]

        def hook(_module, _inputs, output):
            if self._armed:
                hidden = output[0] if isinstance(output, tuple) else output
                self._outputs[slot] = hidden.detach()

        return hook

    def _input_hook(self):
        slot = self._slot[0]

        def hook(_module, args, kwargs):
            if self._armed:
                hidden = args[0] if args else kwargs["hidden_states"]
                self._outputs[slot] = hidden.detach()

        return hook

    def arm(self) -> None:
        self._outputs = [None] * len(self.layer_ids)
        self._armed = True

    def collect(self) -> torch.Tensor:
        return torch.stack(self.collect_layers(), dim=2)

    def collect_layers(self) -> list[torch.Tensor]:
        """The recorded outputs, one ``[batch, seq, hidden]`` per layer id (no copy); disarms."""
        self._armed = False
        outputs, self._outputs = self._outputs, [None] * len(self.layer_ids)
        if any(out is None for out in outputs):
            raise RuntimeError("a capture hook did not fire during the forward pass")
        return outputs  # type: ignore[return-value]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class SpoolWriter:
    """Writes one safetensors capture file per sequence into ``spool_dir``."""

    def __init__(self, spool_dir: str | os.PathLike[str]):
        self.spool_dir = pathlib.Path(spool_dir).expanduser().resolve()
        self.spool_dir.mkdir(parents=True, exist_ok=True)

    def write(self, hidden_states: torch.Tensor, token_ids: Sequence[int], row0: int = 0) -> str:
        """Save ``hidden_states`` ``[T, L, H]`` and ``token_ids`` ``[T]`` of the positions
        ``row0 ..`` (recorded in the file's metadata); return the absolute path."""
        if hidden_states.ndim != 3 or hidden_states.shape[0] != len(token_ids):
            raise ValueError(
                f"hidden_states {tuple(hidden_states.shape)} does not match {len(token_ids)} tokens"
            )
        name = f"hs-{uuid.uuid4().hex}"
        final = self.spool_dir / f"{name}.safetensors"
        tmp = self.spool_dir / f".{name}.safetensors.partial"
        tensors = {
            "hidden_states": hidden_states.detach().to("cpu").contiguous(),
            "token_ids": torch.tensor(list(token_ids), dtype=torch.int64),
        }
        with open(f"{final}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                save_file(tensors, str(tmp), metadata={ROW0_KEY: str(row0)})
                os.replace(tmp, final)
            finally:
                if tmp.exists():
                    tmp.unlink()
        return str(final)
