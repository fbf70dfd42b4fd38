"""The price table: the seeds' figures, sums of items, user overrides, and cost arithmetic."""

import pytest

from mlbench.errors import UsageError
from mlbench.results.cost import PriceTable, cost_usd


def test_the_shipped_table_has_the_original_figures_and_dated_current_prices():
    table = PriceTable.load()
    assert table.hourly("n1-standard-4") == 0.19
    assert table.hourly("n1-standard-4:preemptible") == 0.04
    assert table.hourly("nvidia-tesla-k80:preemptible") == 0.135
    current = [p for p in table if p.checked != "2019"]
    assert {p.provider for p in current} == {"gcp", "aws"} and len(current) >= 10
    assert all(p.source and p.region and p.usd_per_hour > 0 for p in current)


def test_the_shipped_table_prices_current_gpu_instances_with_their_date_and_source():
    table = PriceTable.load()
    expected = {"p5.48xlarge": 55.04, "p4de.24xlarge": 27.447, "g6.xlarge": 0.8048,
                "a3-highgpu-8g": 88.2494, "a2-ultragpu-1g": 5.0688, "g2-standard-4": 0.707}
    for name, usd in expected.items():
        price = next(p for p in table if p.name == name)
        assert price.usd_per_hour == usd and price.kind == "machine"
        assert price.checked.startswith("2025-") and price.source.startswith("https://")
        assert "NVIDIA" in price.source  # the GPUs the price includes


def test_comment_lines_of_a_price_csv_are_skipped(tmp_path):
    user = tmp_path / "mine.csv"
    user.write_text("# from our lab's invoice, 2026-01\nname,usd_per_hour\n  # a note\nlab-box,1.5\n")
    assert PriceTable.load(user).hourly("lab-box") == 1.5


def test_a_machine_and_its_gpu_add_up():
    table = PriceTable.load()
    assert table.hourly("n1-standard-4:preemptible+nvidia-tesla-k80:preemptible") == pytest.approx(0.175)


def test_cost_is_node_seconds_times_the_price_per_node_hour():
    assert cost_usd(3600, 1, 0.19) == pytest.approx(0.19)
    assert cost_usd(1800, 4, 0.04) == pytest.approx(0.08)
    assert cost_usd(100, 2, 0.0) == 0.0


def test_a_user_csv_replaces_and_adds_prices(tmp_path):
    user = tmp_path / "mine.csv"
    user.write_text("name,usd_per_hour\nn1-standard-4,0.25\nlab-box,1.5\n")
    table = PriceTable.load(user)
    assert table.hourly("n1-standard-4") == 0.25 and table.hourly("lab-box") == 1.5
    assert table.hourly("n1-standard-4:preemptible") == 0.04  # the rest is kept


def test_mlbench_prices_applies_first_and_a_given_file_wins(tmp_path, monkeypatch):
    env = tmp_path / "env.yaml"
    env.write_text("lab-box: 2.0\nother: 3.0\n")
    given = tmp_path / "given.json"
    given.write_text('{"lab-box": {"usd_per_hour": 1.0}}')
    monkeypatch.setenv("MLBENCH_PRICES", str(env))
    assert PriceTable.load().hourly("lab-box") == 2.0
    table = PriceTable.load(given)
    assert table.hourly("lab-box") == 1.0 and table.hourly("other") == 3.0


@pytest.mark.parametrize("name, text, message", [
    ("bad.yaml", "lab-box: cheap\n", "must be a number"),
    ("neg.yaml", "lab-box: -1\n", "must be a number"),
    ("list.yaml", "- 1\n- 2\n", "expected a mapping"),
    ("cols.csv", "instance,price\nx,1\n", "name and usd_per_hour"),
    ("plus.yaml", "a+b: 1\n", "a name without"),
])
def test_a_broken_price_file_is_one_clear_error(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        PriceTable.load(path)


def test_an_unknown_instance_suggests_close_names():
    with pytest.raises(UsageError, match="did you mean n1-standard-4"):
        PriceTable.load().hourly("n1-standrd-4")
