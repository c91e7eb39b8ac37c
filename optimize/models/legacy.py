"""Keras files from before tf_keras: what their stored config leaves out that tf_keras reads otherwise.

Keras 2.0.x wrote a Sequential model's config as a bare list of layers (tf_keras and every reader here want
{"name", "layers"}), and its GRU had no `reset_after` setting: it computed what `reset_after=False` computes
today, while tf_keras defaults to True and then refuses the stored weights ("GRU(reset_after=False) is not
compatible with GRU(reset_after=True)"). Both are restored here, exactly as the saving Keras meant them:

    normalized(config)     the config with a Sequential's bare list wrapped as {"name", "layers"}
    restored(config)       (the config with what its Keras meant made explicit, the changes in words)
"""

from __future__ import annotations

import copy

#: Recurrent layers and cells whose `reset_after` an old config leaves out (its Keras had only False).
GRU_CLASSES = frozenset({"GRU", "GRUCell", "CuDNNGRU"})


def normalized(config: dict | None) -> dict | None:
    """A Keras 2.0.x Sequential config (`{"class_name": "Sequential", "config": [layers]}`) in today's form."""
    if isinstance(config, dict) and isinstance(config.get("config"), list):
        return {**config, "config": {"name": config.get("name") or "sequential", "layers": config["config"]}}
    return config


def restored(config: dict) -> tuple[dict, list[str]]:
    """The config with every setting its Keras left out but meant, made explicit: each GRU (a wrapper's
    inner layer and an RNN's cell included) without `reset_after` gets `reset_after=False`. Returns the new
    config (the one given is not changed) and one phrase per change ("GRU 'gru_1': reset_after=False")."""
    out = copy.deepcopy(config)
    changes: list[str] = []

    def visit(node, owner: str | None) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item, owner)
            return
        if not isinstance(node, dict):
            return
        cls, body = node.get("class_name"), node.get("config")
        if cls in GRU_CLASSES and isinstance(body, dict) and "reset_after" not in body:
            body["reset_after"] = False
            name = body.get("name") or owner or cls
            changes.append(f"{cls} {name!r}: reset_after=False")
        name = body.get("name") if isinstance(body, dict) else None
        for value in node.values():
            visit(value, name or owner)

    visit(out, None)
    return out, changes
