"""What a run costs: node-seconds x price per node-hour, from a price table the user can override.

The original mlbench priced its scaling runs on Google Cloud (the original's task results: n1-standard-4 $0.19/h,
preemptible $0.04/h, a preemptible K80 $0.135/h per GPU). ``prices.csv`` beside this module ships
those figures plus on-demand list prices of common GCP (us-central1) and AWS (us-east-1) instance
types, each row with the date it was checked and its source. Prices change and differ by region
and contract, so a user file replaces or adds rows: ``$MLBENCH_PRICES`` and ``--prices FILE``
(CSV with the same columns, or a YAML/JSON mapping ``name: usd_per_hour``; the later wins).

A price names one item or a sum of items joined by ``+``, e.g.
``n1-standard-4:preemptible+nvidia-tesla-k80:preemptible`` for a preemptible machine with one
preemptible K80 (the seeds' GPU runs). Clouds bill by the second, so cost is proportional to time.
"""

from __future__ import annotations

import csv
import difflib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import yaml

from mlbench.errors import UsageError

PRICES_FILE = Path(__file__).with_name("prices.csv")
PRICES_ENV = "MLBENCH_PRICES"


@dataclass(frozen=True)
class Price:
    """One row of the price table: USD per hour of one machine (or one GPU added to a machine)."""

    name: str
    usd_per_hour: float
    kind: str = "machine"
    provider: str = ""
    region: str = ""
    checked: str = ""
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        """`mlbench prices -o json|yaml`: every field, by its name."""
        return asdict(self)


class PriceTable:
    """Prices by name: the shipped table, then $MLBENCH_PRICES, then the user's file."""

    def __init__(self, prices: dict[str, Price]):
        self.prices = dict(prices)

    @classmethod
    def load(cls, user_file: str | os.PathLike | None = None) -> PriceTable:
        prices = read_price_file(PRICES_FILE)
        for extra in (os.environ.get(PRICES_ENV), user_file):
            if extra:
                prices.update(read_price_file(Path(extra).expanduser()))
        return cls(prices)

    def __iter__(self) -> Iterator[Price]:
        return iter(self.prices.values())

    def hourly(self, spec: str) -> float:
        """USD per node-hour of ``spec`` (one name, or names joined by ``+``)."""
        total = 0.0
        for part in (p.strip() for p in spec.split("+")):
            price = self.prices.get(part)
            if price is None:
                close = difflib.get_close_matches(part, list(self.prices), n=3, cutoff=0.5)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise UsageError(f"no price for {part!r} in the price table{hint} "
                                 "(`mlbench prices` lists them; --prices FILE adds your own)")
            total += price.usd_per_hour
        return total


def node_hour_price(instance: str | None, price_per_hour: float | None, prices_file: str | None) -> float | None:
    """USD per node-hour as `compare`, `charts` and `predict` take it: an instance type of the
    price table (``--instance``, from ``--prices`` or the shipped table) or a price given as is
    (``--price-per-hour``); None for neither."""
    if instance and price_per_hour is not None:
        raise UsageError("give --instance or --price-per-hour, not both")
    if price_per_hour is not None and not (math.isfinite(price_per_hour) and price_per_hour >= 0):
        raise UsageError(f"--price-per-hour {price_per_hour}: give a price in USD >= 0")
    if prices_file and not instance:
        raise UsageError("--prices FILE: say which of its prices applies with --instance NAME")
    return PriceTable.load(prices_file).hourly(instance) if instance else price_per_hour


def cost_usd(seconds: float, nodes: int, usd_per_node_hour: float) -> float:
    """Node-seconds times the price per node-hour."""
    return nodes * seconds * usd_per_node_hour / 3600.0


def read_price_file(path: Path) -> dict[str, Price]:
    """Prices from a CSV file (columns name, usd_per_hour, ...; ``#`` lines are comments) or a
    YAML/JSON mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot read the price file {path} ({err.strerror or err})") from None
    if path.suffix.lower() == ".csv":
        # lines starting with '#' are comments: where a table's prices come from, and when
        rows = list(csv.DictReader(line for line in text.splitlines() if not line.lstrip().startswith("#")))
        if rows and not {"name", "usd_per_hour"} <= set(rows[0]):
            raise UsageError(f"{path}: a price CSV needs the columns name and usd_per_hour")
        entries = {(r.get("name") or "").strip(): r for r in rows}
    else:
        try:
            data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as err:
            raise UsageError(f"{path} is not valid {path.suffix[1:].upper() or 'YAML'} "
                             f"({err.__class__.__name__}); expected a mapping name: usd_per_hour") from None
        if not isinstance(data, dict):
            raise UsageError(f"{path}: expected a mapping name: usd_per_hour, e.g. n1-standard-4: 0.19")
        entries = {str(k).strip(): (v if isinstance(v, dict) else {"usd_per_hour": v})
                   for k, v in data.items()}
    return {name: _price(path, name, row) for name, row in entries.items()}


def _price(path: Path, name: str, row: dict[str, Any]) -> Price:
    if not name or "+" in name:
        raise UsageError(f"{path}: a price needs a name without '+' (got {name!r})")
    value: Any = row.get("usd_per_hour")
    try:
        usd = float(value)
    except (TypeError, ValueError):
        usd = math.nan
    if not math.isfinite(usd) or usd < 0:
        raise UsageError(f"{path}: the price of {name} must be a number of USD per hour >= 0, "
                         f"not {value!r}")
    fields = {k: str(row.get(k) or "") for k in ("kind", "provider", "region", "checked", "source")}
    fields["kind"] = fields["kind"] or "machine"
    return Price(name=name, usd_per_hour=usd, **fields)
