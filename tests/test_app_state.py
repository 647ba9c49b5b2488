"""ckptstore.AppState: model + optimizer as one DCP Stateful, restored in place and exactly."""

from __future__ import annotations

import torch

import ckptstore


def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(4, 8)).square().mean().backward()
        optim.step()
        optim.zero_grad()
    return model, optim


def test_app_state_round_trips_model_and_optimizer(tmp_path) -> None:
    model, optim = trained(0)
    with ckptstore.CheckpointManager(str(tmp_path), background="thread") as mgr:
        mgr.save(3, {"app": ckptstore.AppState(model, optim)})
    model2, optim2 = trained(1)  # other weights and moments
    with ckptstore.CheckpointManager(str(tmp_path), background="thread") as mgr:
        assert mgr.restore({"app": ckptstore.AppState(model2, optim2)}) == 3
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    s1, s2 = optim.state_dict()["state"], optim2.state_dict()["state"]
    assert s1.keys() == s2.keys() and len(s1) == 4
    for k in s1:
        assert all(torch.equal(s1[k][n], s2[k][n]) for n in ("exp_avg", "exp_avg_sq", "step"))


def test_app_state_without_an_optimizer(tmp_path) -> None:
    model, _ = trained(0)
    url = str(tmp_path / "step_000000001")
    ckptstore.save({"app": ckptstore.AppState(model)}, url)
    model2, _ = trained(1)
    state = {"app": ckptstore.AppState(model2)}
    assert set(state["app"].state_dict()) == {"model"}
    ckptstore.load(state, url)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
