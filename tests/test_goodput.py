"""ckptstore.planning.goodput: the 8.6 failures/day figures, optimal intervals, properties,
validation, costs."""

from __future__ import annotations

import math
from dataclasses import FrozenInstanceError, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.errors import CkptStoreError, ConfigError
from ckptstore.planning.goodput import (
    MODELS,
    GoodputInputs,
    InputError,
    Prices,
    daly_interval,
    expected_goodput,
    failure_probability,
    failures_per_day,
    plan,
    report_rows,
    young_interval,
)

PP = 0.01  # one percentage point

# --- 8.6 failures a day at 2 h and 30 min intervals -----------------------------------------------


@pytest.mark.parametrize(("interval_min", "expected"), [(120, 0.64), (30, 0.91)])
def test_mission_goodput(interval_min: float, expected: float) -> None:
    inputs = GoodputInputs(interval_min=interval_min, failures_per_day=8.6)
    assert expected_goodput(inputs) == pytest.approx(expected, abs=PP)
    # The same figure is 1 - rate * interval / 2: each failure loses half an interval.
    assert expected_goodput(inputs) == pytest.approx(1 - 8.6 / 24 * interval_min / 60 / 2)


def test_two_tiers_reduce_to_one_and_add_the_peer_tiers_gain() -> None:
    rate = 8.6 / 24
    bucket = GoodputInputs(interval_min=120, failures_per_day=8.6, blocking_s=5, restart_min=10)
    same = replace(bucket, peer_interval_min=120, peer_share=0.5)  # one tier in two names
    assert plan(same).goodput_with_peers == pytest.approx(plan(bucket).goodput)
    assert plan(bucket).goodput_with_peers is None
    free = GoodputInputs(interval_min=120, failures_per_day=8.6, peer_interval_min=30)
    assert plan(free).goodput_with_peers == pytest.approx(1 - rate * (0.9 * 0.25 + 0.1 * 1))
    fast = replace(bucket, peer_interval_min=30, peer_restart_min=1)
    assert plan(fast).goodput_with_peers > plan(bucket).goodput
    with pytest.raises(InputError, match="peer_share"):
        GoodputInputs(interval_min=30, failures_per_day=1, peer_share=1.5)


@pytest.mark.parametrize(("gpus", "expected"), [(256, 0.19), (1024, 0.57)])
def test_mission_failure_probability(gpus: int, expected: float) -> None:
    p = failure_probability(failures_per_day(gpus, 0.01), 30)
    assert p == pytest.approx(expected, abs=PP)
    report = plan(GoodputInputs(interval_min=30, gpus=gpus, afr=0.01, days=30))
    assert report.failure_probability == pytest.approx(p)


def test_exponential_model_figures() -> None:
    # Documented in the module: the higher-order model is a little kinder at long intervals.
    g2h = expected_goodput(GoodputInputs(interval_min=120, failures_per_day=8.6), "exponential")
    g30 = expected_goodput(GoodputInputs(interval_min=30, failures_per_day=8.6), "exponential")
    assert g2h == pytest.approx(0.684, abs=0.001)
    assert g30 == pytest.approx(0.913, abs=0.001)


def test_costs_reduce_model_and_zero_costs_reduce_to_mission_model() -> None:
    base = GoodputInputs(interval_min=60, failures_per_day=4.0)
    costly = replace(base, blocking_s=36.0, restart_min=15.0)
    lam = 4.0 / 24
    assert expected_goodput(costly) == pytest.approx(1 - 0.01 - lam * (0.5 + 0.25))
    assert expected_goodput(costly) < expected_goodput(base) == pytest.approx(1 - lam / 2)


def test_no_failures() -> None:
    inputs = GoodputInputs(interval_min=60, failures_per_day=0.0, blocking_s=36.0)
    assert expected_goodput(inputs) == pytest.approx(0.99)
    assert expected_goodput(inputs, "exponential") == pytest.approx(60 / 60.6)
    report = plan(inputs)
    assert report.failure_probability == 0.0
    assert math.isinf(report.mtbf_hours)
    assert math.isinf(report.young_interval_min) and math.isinf(report.daly_interval_min)
    assert report.goodput_at_young == 1.0 and report.goodput_exponential_at_daly == 1.0


def test_free_saves_give_zero_interval() -> None:
    report = plan(GoodputInputs(interval_min=30, failures_per_day=8.6, restart_min=6))
    assert report.young_interval_min == 0.0 == report.daly_interval_min
    assert report.goodput_at_young == pytest.approx(1 - 8.6 / 24 * 0.1)


# --- optimal intervals --------------------------------------------------------------------


def test_young_and_daly_formulas() -> None:
    assert young_interval(2.0, 100.0) == pytest.approx(20.0)
    s = math.sqrt(2.0 / 200.0)
    assert daly_interval(2.0, 100.0) == pytest.approx(20.0 * (1 + s / 3 + s * s / 9) - 2.0)
    assert daly_interval(300.0, 100.0) == 100.0  # C >= 2 MTBF: checkpoint once per MTBF


def _goodput_at(model: str, rate_d: float, c_s: float, r_min: float, tau_h: float) -> float:
    inputs = GoodputInputs(
        interval_min=tau_h * 60, failures_per_day=rate_d, blocking_s=c_s, restart_min=r_min
    )
    return expected_goodput(inputs, model)


rates = st.floats(0.01, 100.0)  # failures per day
blocking = st.floats(0.1, 3600.0)  # seconds per save
restarts = st.floats(0.0, 120.0)  # minutes


@settings(max_examples=150, deadline=None)
@given(rates, blocking, restarts)
def test_young_is_optimal_for_first_order(rate_d: float, c_s: float, r_min: float) -> None:
    tau = young_interval(c_s / 3600, 24 / rate_d)
    best = _goodput_at("first_order", rate_d, c_s, r_min, tau)
    for k in (0.5, 2.0, 0.9, 1.1):
        assert best >= _goodput_at("first_order", rate_d, c_s, r_min, k * tau) - 1e-12


@settings(max_examples=150, deadline=None)
@given(rates, blocking, restarts)
def test_daly_beats_half_and_double(rate_d: float, c_s: float, r_min: float) -> None:
    tau = daly_interval(c_s / 3600, 24 / rate_d)
    for model in MODELS:
        best = _goodput_at(model, rate_d, c_s, r_min, tau)
        for k in (0.5, 2.0):
            assert best >= _goodput_at(model, rate_d, c_s, r_min, k * tau) - 1e-12


@settings(max_examples=150, deadline=None)
@given(rates, st.floats(0.0, 0.4), restarts)
def test_young_beats_half_and_double_in_exponential_model(
    rate_d: float, c_over_mtbf: float, r_min: float
) -> None:
    # Young's first-order optimum holds for the exponential model while C is small next to the
    # MTBF (it drifts too long from about C > 0.43 MTBF; Daly's formula covers that range).
    mtbf_h = 24 / rate_d
    c_s = max(c_over_mtbf * mtbf_h * 3600, 1e-3)
    tau = young_interval(c_s / 3600, mtbf_h)
    best = _goodput_at("exponential", rate_d, c_s, r_min, tau)
    for k in (0.5, 2.0):
        assert best >= _goodput_at("exponential", rate_d, c_s, r_min, k * tau) - 1e-12


@given(st.floats(0.0, 1e4), st.floats(1e-3, 1e4))
def test_daly_never_longer_than_young(c: float, mtbf: float) -> None:
    assert 0.0 <= daly_interval(c, mtbf) <= young_interval(c, mtbf) * (1 + 1e-12)


# --- monotonicity -------------------------------------------------------------------------

intervals = st.floats(1.0, 24 * 60.0)  # minutes


@settings(max_examples=100, deadline=None)
@given(intervals, rates, blocking, restarts, st.floats(1.0, 10.0), st.sampled_from(MODELS))
def test_goodput_falls_as_costs_rise(
    interval: float, rate_d: float, c_s: float, r_min: float, factor: float, model: str
) -> None:
    base = GoodputInputs(
        interval_min=interval, failures_per_day=rate_d, blocking_s=c_s, restart_min=r_min
    )
    g = expected_goodput(base, model)
    assert 0.0 <= g <= 1.0
    for worse in (
        replace(base, failures_per_day=rate_d * factor),
        replace(base, blocking_s=c_s * factor),
        replace(base, restart_min=r_min * factor + 1.0),
    ):
        assert expected_goodput(worse, model) <= g + 1e-12


@settings(max_examples=100, deadline=None)
@given(intervals, rates, st.floats(0.0, 3600.0), restarts)
def test_first_order_is_a_lower_bound(
    interval: float, rate_d: float, c_s: float, r_min: float
) -> None:
    inputs = GoodputInputs(
        interval_min=interval, failures_per_day=rate_d, blocking_s=c_s, restart_min=r_min
    )
    assert expected_goodput(inputs) <= expected_goodput(inputs, "exponential") + 1e-12


@given(
    st.integers(1, 100_000),
    st.integers(1, 100_000),
    st.floats(0.0, 1.0),
    st.floats(0.1, 365.0),
    st.floats(1.0, 3.0),
)
def test_failure_probability_grows(g1: int, g2: int, afr: float, days: float, more: float) -> None:
    lo, hi = sorted((g1, g2))
    p = failure_probability(failures_per_day(lo, afr), days)
    assert 0.0 <= p <= 1.0
    assert failure_probability(failures_per_day(hi, afr), days) >= p
    assert failure_probability(failures_per_day(lo, afr), days * more) >= p
    assert failures_per_day(hi, afr) == pytest.approx(hi * afr / 365)


@given(st.floats(0.0, 1e4), st.floats(1e-3, 1e4), st.floats(1.0, 10.0))
def test_intervals_grow_with_cost_and_mtbf(c: float, mtbf: float, k: float) -> None:
    for f in (young_interval, daly_interval):
        assert f(c * k, mtbf) >= f(c, mtbf) * (1 - 1e-12)
    assert young_interval(c, mtbf * k) >= young_interval(c, mtbf) * (1 - 1e-12)
    if (c < 2 * mtbf) == (c < 2 * mtbf * k):  # Daly's published formula jumps at C = 2 MTBF
        assert daly_interval(c, mtbf * k) >= daly_interval(c, mtbf) * (1 - 1e-12)


def test_daly_jump_at_two_mtbf() -> None:
    below = daly_interval(2.0 * (1 - 1e-9), 1.0)
    assert below == pytest.approx(8 / 9, rel=1e-4) and daly_interval(2.0, 1.0) == 1.0


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"interval_min": 0, "failures_per_day": 1}, "interval_min must be .*> 0"),
        ({"interval_min": -5, "failures_per_day": 1}, "interval_min"),
        ({"interval_min": math.nan, "failures_per_day": 1}, "interval_min"),
        ({"interval_min": 30, "failures_per_day": 1, "days": 0}, "days must be .*> 0"),
        ({"interval_min": 30, "failures_per_day": -1}, "failures_per_day must be .*>= 0"),
        ({"interval_min": 30, "failures_per_day": 1, "blocking_s": -1}, "blocking_s"),
        ({"interval_min": 30, "failures_per_day": 1, "restart_min": -1}, "restart_min"),
        ({"interval_min": 30, "failures_per_day": 1, "checkpoint_gb": -1}, "checkpoint_gb"),
        ({"interval_min": 30, "failures_per_day": 1, "keep_last": 0}, "keep_last"),
        ({"interval_min": 30, "failures_per_day": 1, "gpus": 0}, "gpus must be a whole"),
        ({"interval_min": 30, "failures_per_day": 1, "gpus": 2.5}, "gpus must be a whole"),
        ({"interval_min": 30, "failures_per_day": 1, "gpus_per_node": 0}, "gpus_per_node"),
        ({"interval_min": 30}, "no failure rate; set failures_per_day, or gpus and afr"),
        ({"interval_min": 30, "afr": 0.01}, "no failure rate"),
        ({"interval_min": 30, "gpus": 8, "afr": 0.01, "failures_per_day": 1}, "not both"),
        ({"interval_min": 30, "gpus": 8, "afr": 1.5}, r"1 % is 0.01"),
        ({"interval_min": 30, "gpus": 8, "afr": -0.01}, "afr"),
    ],
)
def test_inputs_validation(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        GoodputInputs(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError) and isinstance(info.value, CkptStoreError)


def test_function_validation() -> None:
    with pytest.raises(ValueError, match="1 % is 0.01"):
        failures_per_day(256, 1.0 + 1e-9)
    with pytest.raises(ValueError, match="gpus"):
        failures_per_day(0, 0.01)
    with pytest.raises(ValueError, match="days"):
        failure_probability(1.0, -1)
    with pytest.raises(ValueError, match="mtbf"):
        young_interval(1.0, 0.0)
    with pytest.raises(ValueError, match="checkpoint_cost"):
        daly_interval(-1.0, 10.0)
    with pytest.raises(ValueError, match="Prices.gpu_hour"):
        Prices(gpu_hour=-2.0)
    with pytest.raises(ValueError, match="model must be one of"):
        expected_goodput(GoodputInputs(interval_min=30, failures_per_day=1), "linear")


def test_dataclasses_are_frozen() -> None:
    inputs = GoodputInputs(interval_min=30, failures_per_day=1)
    with pytest.raises(FrozenInstanceError):
        inputs.interval_min = 10  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        plan(inputs).account.saves = 1  # type: ignore[misc]


# --- cost account -------------------------------------------------------------------------


def test_cost_account_hand_checked() -> None:
    # 64 GPUs (8 nodes), 1 failure a day for 10 days, save every 60 min blocking 36 s,
    # restart 30 min, 100 GB checkpoints, keep 3, 50 GB data cache per node.
    inputs = GoodputInputs(
        interval_min=60,
        days=10,
        failures_per_day=1.0,
        gpus=64,
        blocking_s=36,
        restart_min=30,
        checkpoint_gb=100,
        keep_last=3,
        data_cache_gb=50,
    )
    prices = Prices(gpu_hour=2.0, storage_gb_month=0.02, transfer_gb=0.01, nvme_gb=0.1)
    r = plan(inputs, prices)
    a = r.account
    assert r.expected_failures == pytest.approx(10)
    assert a.run_hours == 240
    # 10 failures x half of 1 h re-done = 5 h; x 0.5 h restart = 5 h; 240 saves x 0.01 h = 2.4 h.
    assert a.failure_rework.hours == pytest.approx(5.0)
    assert a.failure_rework.gpu_hours == pytest.approx(320.0)
    assert a.failure_rework.cost == pytest.approx(640.0)
    assert a.failure_restarts.hours == pytest.approx(5.0)
    assert a.failure_restarts.cost == pytest.approx(640.0)
    assert a.checkpoint_blocking.hours == pytest.approx(2.4)
    assert a.checkpoint_blocking.gpu_hours == pytest.approx(153.6)
    assert a.checkpoint_blocking.cost == pytest.approx(307.2)
    # The three losses are exactly the first-order goodput's complement.
    assert a.lost_hours == pytest.approx(12.4)
    assert r.goodput == pytest.approx(1 - 12.4 / 240)
    # Storage: 3 x 100 GB for 10 days = 300 GB x (10 / (365/12)) months.
    months = 10 / (365 / 12)
    assert a.storage_gb_months == pytest.approx(300 * months)
    assert a.storage_cost == pytest.approx(6 * months)
    # Transfer: (240 saves + 10 restores) x 100 GB = 25,000 GB -> 250.
    assert a.saves == pytest.approx(240) and a.restores == pytest.approx(10)
    assert a.transfer_gb == pytest.approx(25_000)
    assert a.transfer_cost == pytest.approx(250)
    # Disk: 2 x 100 GB / 8 nodes + 50 GB = 75 GB a node, 600 GB in all -> 60.
    assert a.nodes == 8
    assert a.staging_gb_per_node == pytest.approx(75)
    assert a.staging_gb_total == pytest.approx(600)
    assert a.nvme_cost == pytest.approx(60)
    assert a.total_cost == pytest.approx(640 + 640 + 307.2 + 6 * months + 250 + 60)


def test_cost_account_without_prices_or_gpus() -> None:
    r = plan(GoodputInputs(interval_min=120, failures_per_day=8.6, checkpoint_gb=10))
    a = r.account
    assert a.failure_rework.hours == pytest.approx(8.6 * 30 * 1.0)
    assert a.failure_rework.gpu_hours is None and a.failure_rework.cost is None
    assert a.nodes is None and a.staging_gb_per_node is None and a.nvme_cost is None
    assert a.storage_cost is None and a.transfer_cost is None and a.total_cost is None
    # Partial price lists price what they can.
    a2 = plan(replace(r.inputs, gpus=16), Prices(transfer_gb=0.05)).account
    assert a2.transfer_gb is not None
    assert a2.total_cost == pytest.approx(a2.transfer_gb * 0.05)
    assert a2.failure_rework.gpu_hours == pytest.approx(a.failure_rework.hours * 16)


def test_report_rows() -> None:
    inputs = GoodputInputs(interval_min=120, failures_per_day=8.6)
    rows = report_rows(plan(inputs))
    assert all(
        isinstance(v, float) and isinstance(lbl, str) and isinstance(u, str) for lbl, v, u in rows
    )
    by_label = {(lbl, u): v for lbl, v, u in rows}
    assert by_label[("Goodput (first-order model)", "%")] == pytest.approx(64.17, abs=0.01)
    assert ("Total (priced items)", "$") not in by_label
    assert not any(u == "GPU-h" for _, _, u in rows)  # gpus unknown: left out
    priced = report_rows(
        plan(replace(inputs, gpus=8, checkpoint_gb=1), Prices(gpu_hour=1.0)), currency="EUR"
    )
    labels = {(lbl, u) for lbl, _, u in priced}
    assert ("Lost to restarts", "GPU-h") in labels and ("Total (priced items)", "EUR") in labels
    assert ("Transfer (saves + restores)", "EUR") not in labels


def test_unknown_size_and_free_saves_are_left_out_not_shown_as_zero() -> None:
    report = plan(GoodputInputs(interval_min=60, failures_per_day=1, gpus=16))
    a = report.account
    assert a.storage_gb_months is None and a.transfer_gb is None
    assert a.staging_gb_per_node is None and a.staging_gb_total is None
    labels = {lbl for lbl, _, _ in report_rows(report)}
    assert not {"Checkpoint storage", "Transfer (saves + restores)"} & labels
    assert not any("Young" in lbl or "Daly" in lbl or "blocking" in lbl for lbl in labels)
    costly = report_rows(plan(replace(report.inputs, blocking_s=5.0, checkpoint_gb=2.0)))
    labels = {lbl for lbl, _, _ in costly}
    assert {
        "Young optimal interval",
        "Checkpoint storage",
        "Lost to blocking checkpoint saves",
    } <= labels


def test_input_errors_render_in_the_callers_names() -> None:
    with pytest.raises(InputError) as info:
        GoodputInputs(interval_min=30, failures_per_day=-1)
    assert str(info.value).startswith("GoodputInputs.failures_per_day must be")
    assert info.value.render({"failures_per_day": "--failures-per-day"}).startswith(
        "--failures-per-day must be a finite number >= 0"
    )
    with pytest.raises(InputError) as info:
        GoodputInputs(interval_min=30)
    assert info.value.fields == ("failures_per_day", "gpus", "afr")
    assert info.value.render({"gpus": "--gpus"}) == (
        "no failure rate; set failures_per_day, or --gpus and afr"
    )


# --- ckptstore-tool goodput -----------------------------------------------------------------


def tool(capsys, *argv: str) -> tuple[int, str, str]:
    from ckptstore.cli.main import main

    rc = main(["goodput", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def values(out: str) -> dict[str, str]:
    rows = [line.rsplit(None, 2) for line in out.splitlines()[1:] if line.strip()]
    return {f"{label.strip()} [{unit}]": value for label, value, unit in rows}


def test_cli_without_a_checkpoint_cost_or_size_says_what_to_pass(capsys) -> None:
    rc, out, err = tool(capsys, "--failures-per-day", "8.6", "--interval-min", "120")
    assert rc == 0 and values(out)["Goodput (first-order model) [%]"] == "64.2"
    assert "Young" not in out and "Daly" not in out and "GB-month" not in out
    assert "no checkpoint cost given" in err and "--blocking-s" in err and "--from" in err
    assert "checkpoint size unknown" in err and "--checkpoint-gb" in err
    rc, out, err = tool(
        capsys,
        *("--failures-per-day", "8.6", "--interval-min", "30", "--blocking-s", "2"),
        *("--checkpoint-gb", "10", "--gpus", "16"),
    )
    assert rc == 0 and err == ""
    assert values(out)["Young optimal interval [min]"] == "3.3"  # sqrt(2 * 2 s * 2.79 h)
    assert values(out)["Checkpoint storage [GB-month]"] == "29.6"  # 3 kept x 10 GB x 30 days


def test_cli_numbers_share_one_format(capsys) -> None:
    import re

    rc, out, _ = tool(
        capsys,
        *("--gpus", "256", "--afr", "1%", "--blocking-s", "3", "--checkpoint-gb", "0.01"),
        *("--gpu-hour", "2", "--storage-gb-month", "0.02"),
    )
    got = values(out)
    assert rc == 0 and len(got) > 20
    one_decimal, small = re.compile(r"^-?\d{1,3}(,\d{3})*\.\d$"), re.compile(r"^0\.0\d*$|e-")
    assert all(one_decimal.match(v) or small.search(v) for v in got.values()), got
    assert got["Failures per day [1/day]"] == "0.00701" and got["Run length [h]"] == "720.0"
    assert got["Mean time between failures [h]"] == "3,421.9"


def test_cli_errors_name_flags_and_help_has_no_transfer_options(capsys) -> None:
    rc, _, err = tool(capsys, "--failures-per-day", "-1")
    assert rc == 2 and "--failures-per-day must be a finite number >= 0" in err
    assert "failures_per_day" not in err
    rc, _, err = tool(capsys, "--gpus", "8", "--afr", "0.01", "--failures-per-day", "1")
    assert rc == 2 and "--failures-per-day or as --gpus + --afr, not both" in err
    rc, _, err = tool(capsys, "--interval-min", "0", "--failures-per-day", "1")
    assert rc == 2 and err.startswith("ckptstore-tool: error: --interval-min must be")
    rc, out, _ = tool(capsys, "--help")
    assert rc == 0 and "--blocking-s" in out and "--json" in out
    assert "--part-size-mib" not in out and "--concurrency" not in out


# --- the demo's timeline --------------------------------------------------------------------


def test_timeline_legend_names_only_what_happened_in_distinct_colours(tmp_path) -> None:
    from harness.chaos import ChaosResult, KillRecord, SegmentRecord
    from harness.goodput_report import _COLORS, account, plot_timeline, timeline_kinds
    from harness.runlog import read_attempts
    from tests.resilience.test_runlog import write_attempt

    d = str(tmp_path)
    end0 = write_attempt(d, 0, range(1, 5), t=0.0, saves={2: "aa"})
    end1 = write_attempt(d, 1, range(3, 7), t=end0 + 3, restored=2, saves={2: "aa", 4: "bb"})
    result = ChaosResult(
        d,
        d,
        [SegmentRecord(2, launched=0.0, exited=end1 + 1, returncode=0)],
        [KillRecord(0, 0, "random", 1, pid=1001, t=end0 + 0.25, step=4)],
    )
    acct = account(result, read_attempts(d), interval_steps=2)
    kinds = timeline_kinds(acct)
    assert "resize" not in kinds  # no resize happened: not in the legend
    assert {"startup", "train", "redone", "restart", "shutdown"} <= set(kinds)
    assert len(set(_COLORS.values())) == len(_COLORS)  # startup and shutdown told apart
    png = plot_timeline(acct, str(tmp_path / "t.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


# --- ckptstore.planning.scale: projection to 1k-100k GPUs ----------------------------------------

from ckptstore.planning.scale import (  # noqa: E402
    LAYOUTS,
    SPREAD_PREFIXES,
    Cluster,
    Limit,
    RankFigures,
    ScalePrices,
    first_store_limit,
    hottest_prefix_ranks,
    project,
    puts_per_file,
    restore_phase,
    save_phase,
    store_bound_from,
    sweep,
)

MiB = 2**20
#: 2 GB per rank in 32 MiB parts (60 parts, 62 PUTs per file), 1 GB/s up, 2 GB/s down.
FIG = RankFigures(bytes_per_rank=2e9, write_gb_s=1.0, read_gb_s=2.0, blocking_s=1.5)
figures = st.builds(
    RankFigures,
    bytes_per_rank=st.floats(1e3, 1e12),
    write_gb_s=st.floats(0.01, 100),
    read_gb_s=st.floats(0.01, 100),
    blocking_s=st.floats(0, 60),
    files_per_rank=st.integers(1, 16),
    part_bytes=st.integers(MiB, 512 * MiB),
)
clusters = st.builds(
    Cluster,
    gpus_per_node=st.integers(1, 16),
    nic_gb_s=st.floats(0.1, 100),
    store_gb_s=st.none() | st.floats(1, 1e5),
    local_gb_s=st.none() | st.floats(0.1, 100),
)


def test_requests_per_file_count_multipart_initiate_and_complete() -> None:
    assert FIG.parts_per_file == 60 and puts_per_file(FIG) == 62
    small = replace(FIG, bytes_per_rank=MiB)
    assert small.parts_per_file == 1 and puts_per_file(small) == 1  # one plain PUT
    split = replace(FIG, files_per_rank=4)  # 500 MB files: 15 parts each
    assert split.parts_per_file == 15 and puts_per_file(split) == 17
    save = save_phase(split, Cluster(), 1000, "flat")
    assert save.requests == 1000 * 4 * 17 + Cluster().commit_puts


def test_worked_sweep_binding_limits_and_crossovers() -> None:
    points = {(p.gpus, p.layout): p for p in sweep(FIG, Cluster())}
    assert sorted(points) == [(n, lay) for n in (1_000, 10_000, 100_000) for lay in LAYOUTS]
    # Flat: all 62,005 PUTs of 1k ranks share one prefix at 3,500/s -> 17.7 s, not 2 s.
    flat = points[(1_000, "flat")]
    assert flat.save.binding == Limit.PREFIX_REQUEST_RATE
    assert flat.save.seconds == pytest.approx((1_000 * 62 + 5) / 3500)
    assert flat.save.prefix_rate == pytest.approx(3500)
    # Spread: 4 ranks per sub-prefix; the rank's own 2 GB at 1 GB/s binds.
    spread = points[(1_000, "spread")]
    assert spread.save.binding == Limit.PER_RANK_BANDWIDTH and spread.save.seconds == 2.0
    assert spread.save.hottest_prefix_requests == 4 * 62 and spread.save.hottest_prefix == "shard"
    # At 100k ranks even 391 ranks per sub-prefix exceed it.
    big = points[(100_000, "spread")]
    assert big.save.binding == Limit.PREFIX_REQUEST_RATE
    assert big.save.seconds == pytest.approx(391 * 62 / 3500)
    # Restores: rank 0 alone reads the 3 small objects, so the step's own prefix sees 3 GETs
    # at any GPU count; spread at 10k: 40 ranks x 60 GETs per sub-prefix, and each rank's own
    # 2 GB at 2 GB/s binds.
    r = points[(10_000, "spread")].restore_root
    assert r.binding == Limit.PER_RANK_BANDWIDTH and r.seconds == pytest.approx(1.0)
    assert r.hottest_prefix == "shard" and r.hottest_prefix_requests == 40 * 60
    assert r.requests == 10_000 * 60 + 3
    # Every rank opening the step itself (3 GETs each on the step's prefix) bound it there.
    each = Cluster(meta_gets_per_restore=0, meta_gets_per_rank=3)
    r_each = restore_phase(FIG, each, 10_000, "spread")
    assert r_each.binding == Limit.PREFIX_REQUEST_RATE and r_each.hottest_prefix == "step"
    assert r_each.seconds == pytest.approx(3 * 10_000 / 5500)
    # The crossovers, in closed form: flat n*62+5 > 2*3500; spread ceil(n/256)*62 > 7000.
    assert store_bound_from(FIG, Cluster(), "flat") == 113
    assert store_bound_from(FIG, Cluster(), "spread") == 112 * 256 + 1
    # Restore: spread ceil(n/256)*60 > 5500 (1 s); flat n*60+3 > 5500. Per rank: 3n > 5500.
    assert store_bound_from(FIG, Cluster(), "spread", "restore") == 91 * 256 + 1
    assert store_bound_from(FIG, Cluster(), "flat", "restore") == 92
    assert store_bound_from(FIG, each, "spread", "restore") == 1834
    assert first_store_limit(FIG, Cluster(), "spread", "restore") == (
        91 * 256 + 1,
        Limit.PREFIX_REQUEST_RATE,
    )
    assert first_store_limit(FIG, Cluster(), "flat") == (113, Limit.PREFIX_REQUEST_RATE)
    # A store capped at 50 GB/s: 51 ranks x 2 GB take 2.04 s > each rank's 2 s.
    capped = Cluster(store_gb_s=50.0)
    assert first_store_limit(FIG, capped, "spread") == (51, Limit.STORE_BANDWIDTH)
    for lay in LAYOUTS:
        n = store_bound_from(FIG, Cluster(), lay)
        assert n is not None
        assert save_phase(FIG, Cluster(), n - 1, lay).binding == Limit.PER_RANK_BANDWIDTH
        assert save_phase(FIG, Cluster(), n, lay).binding == Limit.PREFIX_REQUEST_RATE


def test_binding_limit_switches_where_the_numbers_say() -> None:
    few = 64  # few ranks: no prefix pressure
    assert save_phase(FIG, Cluster(), few, "spread").binding == Limit.PER_RANK_BANDWIDTH
    # A slow NIC: 8 ranks x 2 GB over 4 GB/s = 4 s > 2 s per rank.
    assert save_phase(FIG, Cluster(nic_gb_s=4.0), few, "spread").binding == Limit.NIC
    # A store capped at 50 GB/s: 128 GB in 2.56 s > 2 s.
    capped = save_phase(FIG, Cluster(store_gb_s=50.0), few, "spread")
    assert capped.binding == Limit.STORE_BANDWIDTH and capped.seconds == pytest.approx(2.56)
    # Faster ranks move the crossover down: store-side limits bind sooner.
    quick = replace(FIG, write_gb_s=4.0)
    assert store_bound_from(quick, Cluster(), "flat") < store_bound_from(FIG, Cluster(), "flat")
    # A store without request limits that matter and no cap: never store-bound.
    loose = Cluster(put_per_prefix_s=1e12, get_per_prefix_s=1e12)
    assert store_bound_from(FIG, loose, "spread") is None


def test_blocking_grows_only_when_saves_outlast_the_interval() -> None:
    slow = project(FIG, Cluster(), 100_000, "flat", interval_min=10)
    assert slow.save.seconds > 600
    assert slow.blocking_s == pytest.approx(FIG.blocking_s + slow.save.seconds - 600)
    # Steady state: one save per upload plus its staging copy.
    period = slow.save.seconds + FIG.blocking_s
    assert slow.saves_per_month == pytest.approx(365 * 24 / 12 * 3600 / period)
    assert project(FIG, Cluster(), 100_000, "spread", interval_min=10).blocking_s == 1.5


def test_local_tier_restore() -> None:
    cluster = Cluster(local_gb_s=10.0)
    # 8 ranks x 2 GB from a 10 GB/s disk: 1.6 s, whatever the GPU count...
    assert project(FIG, cluster, 1_000, "flat").restore_local_s == pytest.approx(1.6)
    # ...even at 100k: ranks check their local marker against the one rank 0 broadcast.
    assert project(FIG, cluster, 100_000, "flat").restore_local_s == pytest.approx(1.6)
    # Had every rank GET the remote marker itself, 100k such GETs would take longer.
    each = Cluster(local_gb_s=10.0, local_check_gets_per_rank=1, meta_gets_per_restore=0)
    assert project(FIG, each, 100_000, "flat").restore_local_s == pytest.approx(100_000 / 5500)
    assert project(FIG, Cluster(), 1_000, "flat").restore_local_s is None


def test_costs() -> None:
    prices = ScalePrices(storage_gb_month=0.023, put_per_1k=0.005, get_per_1k=0.0004, gpu_hour=2)
    p = project(FIG, Cluster(), 1_000, "spread", keep_last=2, prices=prices)
    assert p.checkpoint_gb == pytest.approx(2_000)
    assert p.cost.per_save == pytest.approx(p.save.requests / 1000 * 0.005)
    assert p.cost.per_restore == pytest.approx(p.restore_root.requests / 1000 * 0.0004)
    assert p.cost.storage_month == pytest.approx(2 * 2_000 * 0.023)
    assert p.cost.blocking_month == pytest.approx(1.5 * p.saves_per_month * 1_000 / 3600 * 2)
    total = p.cost.storage_month + p.cost.requests_month + p.cost.blocking_month
    assert p.cost.per_month == pytest.approx(total)
    bare = project(FIG, Cluster(), 1_000, "spread")
    assert bare.cost.per_save is None and bare.cost.per_month is None


@settings(max_examples=60, deadline=None)
@given(figures, clusters, st.integers(1, 200_000), st.integers(1, 200_000))
def test_monotone_in_gpus(fig: RankFigures, cluster: Cluster, a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    for lay in LAYOUTS:
        p, q = project(fig, cluster, lo, lay), project(fig, cluster, hi, lay)
        assert q.save.seconds >= p.save.seconds and q.blocking_s >= p.blocking_s
        assert q.restore_root.seconds >= p.restore_root.seconds
        assert q.save.requests >= p.save.requests
        assert q.save.hottest_prefix_requests >= p.save.hottest_prefix_requests
        assert q.checkpoint_gb >= p.checkpoint_gb
        assert p.save.seconds == max(p.save.limit_s.values())  # the binding limit's time
        assert p.save.prefix_rate <= cluster.put_per_prefix_s * (1 + 1e-9)
    # Blocking is the per-rank figure at any size while saves commit within the interval.
    p = project(fig, cluster, hi, "spread", interval_min=1e9)
    assert p.blocking_s == fig.blocking_s
    if cluster.local_gb_s is not None:
        local_lo = project(fig, cluster, lo, "spread").restore_local_s
        assert local_lo is not None and p.restore_local_s is not None
        assert p.restore_local_s >= local_lo
        disk = fig.bytes_per_rank * min(cluster.gpus_per_node, lo) / (cluster.local_gb_s * 1e9)
        checks = cluster.meta_gets_per_restore / 5500  # rank 0's GETs, broadcast to all
        assert local_lo == max(disk, fig.bytes_per_rank / (fig.read_gb_s * 1e9), checks)


@settings(max_examples=60, deadline=None)
@given(figures, st.integers(1, 10**6))
def test_spread_divides_prefix_load_by_up_to_256(fig: RankFigures, ranks: int) -> None:
    assert hottest_prefix_ranks(ranks, "flat") == ranks
    spread_ranks = hottest_prefix_ranks(ranks, "spread")
    assert ranks / SPREAD_PREFIXES <= spread_ranks <= ranks
    flat, spread = (save_phase(fig, Cluster(), ranks, lay) for lay in LAYOUTS)
    assert flat.requests == spread.requests  # the same objects, other names
    ratio = flat.hottest_prefix_requests / spread.hottest_prefix_requests
    # flat: shards S + commit objects c in one prefix; spread: max(ceil(S/256), c), and
    # S <= 256 * that, c <= that: at most 257x (256x when the commit objects are few)
    assert 1 <= ratio <= SPREAD_PREFIXES + 1
    if ranks % SPREAD_PREFIXES == 0:  # the commit objects' prefix is not one of the 256
        shard = ranks * fig.files_per_rank * puts_per_file(fig)
        assert flat.hottest_prefix_requests == shard + Cluster().commit_puts
        assert spread.hottest_prefix_requests == max(shard // 256, Cluster().commit_puts)
    r_flat, r_spread = (restore_phase(fig, Cluster(), ranks, lay) for lay in LAYOUTS)
    assert r_flat.hottest_prefix_requests >= r_spread.hottest_prefix_requests


def test_scale_inputs_are_checked_and_frozen() -> None:
    with pytest.raises(InputError, match="RankFigures.bytes_per_rank must be a finite number > 0"):
        RankFigures(bytes_per_rank=0, write_gb_s=1, read_gb_s=1)
    with pytest.raises(InputError, match="files_per_rank must be a whole number") as info:
        RankFigures(bytes_per_rank=1, write_gb_s=1, read_gb_s=1, files_per_rank=0)
    assert info.value.render({"files_per_rank": "--files-per-rank"}).startswith("--files-per")
    with pytest.raises(InputError, match="Cluster.nic_gb_s"):
        Cluster(nic_gb_s=-1)
    with pytest.raises(InputError, match="ScalePrices.put_per_1k"):
        ScalePrices(put_per_1k=math.inf)
    with pytest.raises(InputError, match="layout must be one of"):
        save_phase(FIG, Cluster(), 8, "wide")
    with pytest.raises(InputError, match="empty"):
        sweep(FIG, Cluster(), ())
    err = pytest.raises(InputError, save_phase, FIG, Cluster(), 0, "flat").value
    assert isinstance(err, ConfigError) and isinstance(err, ValueError)
    with pytest.raises(FrozenInstanceError):
        FIG.blocking_s = 2.0  # type: ignore[misc]
