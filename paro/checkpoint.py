"""Full state dicts of a wrapped module: what ``state_dict()`` and ``load_state_dict()`` see.

Between uses a sharded bucket's parameters are empty tensors (``paro/bucket.py``), so torch's own
``state_dict`` would save nothing and ``load_state_dict`` would find every shape wrong. Two hooks
on the wrapped module make both work the way FSDP's full state dict does, whether they are called
on the wrapper (keys ``module.<name>``) or on the module itself:

- **saving**: each trainable parameter's entry becomes a copy of the full parameter (with mixed
  precision the float32 master weight), gathered bucket by bucket; a parameter tied under several
  names gets the same tensor under each;
- **loading**: before torch copies the entries, every bucket is gathered and its parameters bound
  to the full views, so torch's own checks (missing and unexpected keys, shapes) and copies apply
  unchanged; afterwards each rank keeps its shard of the result and frees the rest. With mixed
  precision the float32 values given become the master weights exactly.

Both are collective: every rank calls them, with the same keys and shapes. Frozen parameters and
buffers are not sharded and go through torch untouched. Optimizer states are not included: they
are this rank's shards, in ``model.optimizer.state_dict()``.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .bucket import Bucket

Gather = Callable[[torch.Tensor, str], torch.Tensor]


class FullStateDict:
    """The save and load hooks of one wrapped module (see the module docstring)."""

    def __init__(self, module: torch.nn.Module, buckets: list[Bucket], gather: Gather) -> None:
        self.buckets, self.gather = buckets, gather
        names: dict[int, list[str]] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        self.names = [[names[id(p)] for _, p in b.named] for b in buckets]
        """Per bucket, per parameter: every name it has in the module (tied weights: several)."""
        self._masters: list[list[torch.Tensor | None]] | None = None
        """While a load runs: per bucket, per parameter, the tensor given for it (or None)."""
        # torch >= 2.4 has only the private spelling of these two hooks (FSDP uses them too)
        self._handles = [module._register_state_dict_hook(self._save),
                         module._register_load_state_dict_pre_hook(self._before_load,
                                                                   with_module=True),
                         module.register_load_state_dict_post_hook(self._after_load)]

    def remove(self) -> None:
        """Remove the hooks from the module."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def _save(self, module: Any, state_dict: dict[str, Any], prefix: str, meta: Any) -> None:
        """Replace the trainable parameters' entries with their full values."""
        for b, names in zip(self.buckets, self.names):
            for aliases, value in zip(names, b.full_values(self.gather)):
                for name in aliases:
                    state_dict[prefix + name] = value

    def _before_load(self, module: Any, state_dict: dict[str, Any], prefix: str, meta: Any,
                     strict: bool, missing: list[str], unexpected: list[str],
                     errors: list[str]) -> None:
        """Gather every bucket and bind its parameters, for torch to copy the entries into."""
        if meta.get("assign_to_params_buffers", False):
            raise ValueError("load_state_dict(assign=True) would replace the parameters that "
                             "ParoDataParallel shards; load without assign")
        self._masters = [[self._given(state_dict, prefix, aliases, shape)
                          for aliases, shape in zip(names, b.shapes)]
                         for b, names in zip(self.buckets, self.names)]
        for b in self.buckets:
            b.ready()

    def _after_load(self, module: Any, incompatible: Any) -> None:
        """Keep each rank's shard of what torch loaded and free the gathered buffers."""
        if self._masters is None:
            return
        for b, given in zip(self.buckets, self._masters):
            b.keep_loaded(given)
        self._masters = None

    @staticmethod
    def _given(state_dict: dict[str, Any], prefix: str, aliases: list[str],
                shape: torch.Size) -> torch.Tensor | None:
        """The value given for a parameter under any of its names, if it has the right shape
        (a wrong one is torch's error to report)."""
        for name in aliases:
            value = state_dict.get(prefix + name)
            if isinstance(value, torch.Tensor) and value.shape == shape:
                return value
        return None
