"""Uploaded config.json models, kept in memory (a small LRU) under an id the other endpoints accept."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from meshplan.hf import model_from_hf_config
from meshplan.server import parse
from meshplan.spec.model import ModelSpec

CAPACITY = 32


class ModelStore:
    """The last ``capacity`` uploaded models by id; the same upload always gets the same id."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._items: OrderedDict[str, ModelSpec] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, body: bytes, *, name: str | None = None) -> tuple[str, ModelSpec]:
        """Parse a config.json body into a ModelSpec and keep it; ValueError for anything malformed."""
        config = parse.config_body(body)
        given = name or str(config.get("_name_or_path") or "").rsplit("/", 1)[-1]
        label = parse.upload_name(given or f"uploaded-{config.get('model_type', 'model')}")
        spec = model_from_hf_config(config, name=label)  # ValueError for anything it refuses
        digest = hashlib.sha256(label.encode() + b"\0" + body).hexdigest()[:12]
        model_id = f"{parse.UPLOAD_PREFIX}{digest}"
        with self._lock:
            self._items[model_id] = spec
            self._items.move_to_end(model_id)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
        return model_id, spec

    def get(self, model_id: str) -> ModelSpec:
        with self._lock:
            spec = self._items.get(model_id.strip())
            if spec is None:
                raise ValueError(f"uploaded model {model_id!r} is not (or no longer) on the server: upload it again")
            self._items.move_to_end(model_id.strip())
            return spec

    def resolve(self, value: str) -> ModelSpec | str:
        """A catalog name (checked) or an uploaded model's spec, for the reports' ``model`` argument."""
        if len(value) > parse.MAX_NAME_CHARS:
            raise ValueError(f"model name is {len(value)} characters; the limit is {parse.MAX_NAME_CHARS}")
        if parse.is_upload_id(value):
            return self.get(value)
        return parse.catalog_model(value)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
