"""Network options: tc's units, one clear line for bad input, labels, and the qdiscs they make."""

from __future__ import annotations

import pytest

from mlbench.errors import UsageError
from mlbench.network.kube import cni_annotations, init_container, shape_pod
from mlbench.network.settings import (NetworkSettings, describe_network, format_rate, network_options,
                                      parse_loss, parse_rate, parse_time)
from mlbench.network.tc import netem_limit, receive_qdiscs, transmit_qdiscs


@pytest.mark.parametrize("text,bps", [("100mbit", 1e8), ("1gbit", 1e9), ("10Gbit", 1e10), ("2.5gbit", 2.5e9),
                                      ("1gbit/s", 1e9), ("500kbit", 5e5), ("1mibit", 2**20),
                                      ("125mbps", 1e9)])  # tc: bps is bytes per second
def test_rates_are_read_in_tc_units(text, bps):
    assert parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize("text,seconds", [("5ms", 5e-3), ("0.5ms", 5e-4), ("500us", 5e-4), ("1s", 1.0),
                                          ("0", 0.0), ("250usec", 2.5e-4)])
def test_times_are_read_in_tc_units(text, seconds):
    assert parse_time(text, "--latency") == pytest.approx(seconds)


@pytest.mark.parametrize("call,message", [
    (lambda: parse_rate("0"), "must be more than 0"),
    (lambda: parse_rate("0mbit"), "must be more than 0"),
    (lambda: parse_rate("fast"), "expected a number and a unit, e.g. 100mbit"),
    (lambda: parse_rate("100"), "give a unit, e.g. 100mbit"),
    (lambda: parse_rate("1furlong"), "unknown unit 'furlong'"),
    (lambda: parse_rate("5tbit"), "from 1kbit to 1tbit"),
    (lambda: parse_time("-1ms", "--latency"), "cannot be negative"),
    (lambda: parse_time("5", "--latency"), "give a unit, e.g. 5ms"),
    (lambda: parse_loss("101%"), "from 0% to below 100%"),
    (lambda: parse_loss("-1%"), "from 0% to below 100%"),
    (lambda: parse_loss("lots"), "expected a percentage"),
    (lambda: network_options(None, None, "1ms", None), "give --latency too"),
    (lambda: network_options(None, "1ms", "2ms", None), "more than the latency"),
    (lambda: network_options("1gbit,,10gbit", None, None, None), "separated by commas"),
    (lambda: network_options("1gbit,1gbit", None, None, None), "given twice"),
    (lambda: network_options("1gbit", "1ms", None, None, "cni"), "rate only"),
])
def test_bad_network_options_are_one_sentence(call, message):
    with pytest.raises(UsageError, match=message) as err:
        call()
    assert "\n" not in str(err.value)


def test_a_comma_list_of_rates_is_one_network_each_with_the_same_latency():
    networks = network_options("100mbit,1gbit,10gbit", "0.5ms", None, "0.1%")
    assert [n.bandwidth_bps for n in networks] == [1e8, 1e9, 1e10]
    assert {(n.latency_s, n.loss_percent) for n in networks} == {(5e-4, 0.1)}
    assert network_options(None, None, None, None) == [None]


def test_labels_say_rate_and_latency_in_one_line():
    assert NetworkSettings(1e9, 5e-4).label() == "1 Gbit/s, 0.5 ms"
    assert NetworkSettings(1e8, 5e-3, 1e-3, 0.1).label() == "100 Mbit/s, 5 ms +/- 1 ms, 0.1% loss"
    assert NetworkSettings(None, 5e-5).label() == "full rate, 50 us"
    assert format_rate(2.5e9) == "2.5 Gbit/s"
    assert describe_network(None) == "as it is (not emulated)"
    recorded = {**NetworkSettings(1e9).to_dict(), "mechanism": "netns+tc", "detail": "htb"}
    assert describe_network(recorded) == "1 Gbit/s, emulated (netns+tc: htb)"


def test_settings_survive_run_json_and_the_command_line():
    settings = NetworkSettings(1e9, 5e-4, 1e-4, 0.25)
    assert NetworkSettings.from_dict({**settings.to_dict(), "mechanism": "netns+tc"}) == settings
    (again,) = network_options(*[settings.to_args()[i + 1] for i in range(0, 8, 2)])
    assert again == settings


def test_the_rate_is_limited_on_both_directions_and_delay_loss_on_the_receiving_side():
    settings = NetworkSettings(1e9, 5e-4, 0.0, 0.1)
    assert transmit_qdiscs("mlb0", settings) == [
        ["qdisc", "add", "dev", "mlb0", "root", "handle", "1:", "htb", "default", "1"],
        ["class", "add", "dev", "mlb0", "parent", "1:", "classid", "1:1", "htb", "rate", "1000000000bit",
         "ceil", "1000000000bit", "quantum", "200000"]]
    receive = receive_qdiscs("mlbp0", settings)
    assert receive[:2] == [[word.replace("mlb0", "mlbp0") for word in c] for c in transmit_qdiscs("mlb0", settings)]
    assert receive[2] == ["qdisc", "add", "dev", "mlbp0", "parent", "1:1", "handle", "10:", "netem",
                          "limit", "1000", "delay", "500us", "loss", "random", "0.1%"]
    delay_only = receive_qdiscs("mlbp0", NetworkSettings(None, 1e-3))
    assert delay_only[0][:6] == ["qdisc", "add", "dev", "mlbp0", "root", "handle"]


def test_netem_holds_twice_the_bandwidth_delay_product():
    # 10 Gbit/s x 5 ms = 6.25 MB in flight = 4,128 full frames; doubled
    assert netem_limit(NetworkSettings(1e10, 5e-3)) == 8257
    assert netem_limit(NetworkSettings(1e8, 5e-4)) == 1000


def test_pods_are_shaped_by_an_init_container_running_the_shaping_module_or_by_cni_annotations():
    settings = NetworkSettings(1e9, 5e-4)
    container = init_container(settings, "img")
    assert container["command"] == ["python", "-m", "mlbench.network.shape", "--device", "eth0",
                                    "--bandwidth", "1000000000bit", "--latency", "500us"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert cni_annotations(NetworkSettings(1e8, shaping="cni")) == {
        "kubernetes.io/ingress-bandwidth": "100M", "kubernetes.io/egress-bandwidth": "100M"}
    pod = {"metadata": {}, "spec": {"containers": []}}
    assert shape_pod(pod, None, "img") == {"metadata": {}, "spec": {"containers": []}}
