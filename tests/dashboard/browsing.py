"""What the browser tests share: the requests a page sends, screenshots and the ink in a box of
them, where an element is drawn (its box, and whether it is what the browser draws at its
centre), and runs recorded as running (no process behind them: cancelling one marks it
cancelled).
"""

from __future__ import annotations

import re
import time
from typing import Any

from PIL import Image

from mlbench.results.store import RUNNING, RunStore
from tests.results.recorded import record_run

#: The box of the element a selector names, in viewport pixels, and whether it is what is drawn
#: at its centre (not hidden under another element, nor clipped); null when there is none.
BOX = """(selector) => {
  const node = typeof selector === 'string' ? document.querySelector(selector) : selector;
  if (!node) return null;
  const r = node.getBoundingClientRect();
  const hit = document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2);
  return {left: r.left, top: r.top, right: r.right, bottom: r.bottom, drawn: !!hit && node.contains(hit)};
}"""


def rgb(hex_colour: str) -> str:
    """``#rrggbb`` as the browser's computed styles say it: ``rgb(r, g, b)``."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


#: Each legend entry of a uPlot chart (the container's id): its label, the colour of its marker
#: (its line's) and its box.
LEGEND = """(id) => [...document.querySelectorAll(`#${id} .u-legend .u-series`)].slice(1).map((row) => {
  const marker = row.querySelector('.u-marker'), r = marker.getBoundingClientRect();
  return {label: row.querySelector('.u-label').textContent, colour: getComputedStyle(marker).borderTopColor,
          box: {left: r.left, top: r.top, right: r.right, bottom: r.bottom}};
})"""


def box(page, selector) -> dict[str, Any] | None:
    return page.evaluate(BOX, selector)


def inside(inner: dict, area: dict) -> bool:
    return (inner["left"] >= area["left"] - 0.5 and inner["right"] <= area["right"] + 0.5
            and inner["top"] >= area["top"] - 0.5 and inner["bottom"] <= area["bottom"] + 0.5)


def in_viewport(page, inner: dict | None) -> bool:
    """Whether a box is drawn, whole, inside the page's viewport."""
    size = page.viewport_size
    return bool(inner) and inner["drawn"] and inside(inner, {"left": 0, "top": 0, "right": size["width"],
                                                               "bottom": size["height"]})


def requests_to(page, pattern: str) -> list[str]:
    """The requests other than GET that the page sends to URLs matching ``pattern``, as they go."""
    sent: list[str] = []
    page.on("request", lambda request: sent.append(f"{request.method} {request.url}")
            if re.search(pattern, request.url) and request.method != "GET" else None)
    return sent


def screenshot(page, path) -> Image.Image:
    """The viewport as the browser draws it, saved at ``path`` and read back."""
    page.screenshot(path=path)
    image = Image.open(path).convert("RGB")
    size = page.viewport_size
    assert image.size == (size["width"], size["height"])
    return image


def inked(image: Image.Image, area: dict, *, red: bool = False) -> bool:
    """Whether the screenshot has text drawn in ``area`` (dark pixels; ``red``: the danger colour)."""
    crop = image.crop((round(area["left"]) + 1, round(area["top"]) + 1, round(area["right"]) - 1,
                       round(area["bottom"]) - 1))
    data = crop.tobytes()
    pixels = zip(data[0::3], data[1::3], data[2::3])
    if red:
        return any(r > 150 and g < 110 and b < 110 for r, g, b in pixels)
    return any(r + g + b < 3 * 150 for r, g, b in pixels)


def record_running(store: RunStore, *, workers: int, name: str, task: str = "task2a",
                   network: dict[str, Any] | None = None) -> str:
    """A run recorded as running (it trained one interval, no process behind it); its id."""
    record = record_run(store, workers=workers, task=task, state=RUNNING, evaluated=False, network=network)
    store.update(record.id, name=name, finished_at=None, reason=None)
    return record.id


def dismiss_twice(page, button, run_id: str, name: str, sent: list[str]) -> None:
    """Clicks ``button`` (a locator), whose confirmation names the run, and dismisses it: its
    keep button, then Escape; no request goes out (``sent``: :func:`requests_to`'s list)."""
    dialog = page.locator("dialog.confirm")
    for dismiss in (lambda: dialog.locator("button.cancel").click(), lambda: page.keyboard.press("Escape")):
        button.click()
        dialog.wait_for()
        assert run_id in dialog.inner_text() and name in dialog.inner_text()
        dismiss()
        dialog.wait_for(state="detached")
    time.sleep(1.5)  # a request sent on dismissal would have been made by now
    assert sent == []


def accept(page, button, path) -> None:
    """Clicks ``button`` and confirms, with a screenshot of the confirmation at ``path``."""
    button.click()
    page.locator("dialog.confirm").wait_for()
    screenshot(page, path)
    page.locator("dialog.confirm button.confirm-yes").click()
