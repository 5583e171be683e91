"""The models panel's title offers the model actions only where the console may send them."""

from __future__ import annotations

from console.widgets.models import title
from gate.data.snapshot import ModelView


def model(name: str, status: str) -> ModelView:
    return ModelView("r", name, f"r/{name}", status, "", False, 0, 2, 1024, 0, 0, 0.4, 1, 0, 0, 3.0, 2)


def test_a_read_only_console_does_not_offer_load_unload_pin() -> None:
    models = (model("tiny", "loaded"), model("tiny2", "unloaded"))
    assert title(models) == "models 1/2 loaded  (m: load, unload, pin)"
    # a trial's read-only panel still said "(m: load, unload, pin)", which it refuses
    assert title(models, read_only=True) == "models 1/2 loaded  (m: the rows)"
