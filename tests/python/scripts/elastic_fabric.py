"""A Lightning Fabric loop for the elastic tests: one epoch of an indexed dataset
whose steps go through ``fabric.strategy.step`` (ddplug's Fabric strategy), a rank
killed at a chosen step (elastic_common.py), and the record file the tests count
from. In place only: ``python elastic_fabric.py --devices N`` (Fabric's launcher).
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader

import lightning.fabric as lf

import elastic_common as E
import ddplug.fabric
from ddplug.nn.gradsync import check_parameters_equal


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=2)
    args = p.parse_args()
    strategy = ddplug.fabric.DdplugStrategy(config=E.config())
    fabric = lf.Fabric(accelerator="cpu", devices=args.devices, strategy=strategy)
    fabric.launch()
    model = E.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = fabric.setup(model, opt)
    loader = fabric.setup_dataloaders(DataLoader(E.Indexed(E.N), batch_size=E.B, shuffle=True))
    ctx = strategy.context
    rec = E.Record(ctx.membership()["identity"])
    stream = strategy.streams["train"]
    killed = False
    for batch in loader:
        idx, x, y = batch
        step = stream.committed_in_epoch
        rec.draw(step, idx.tolist())
        if step == E.STEP and not killed:
            killed = True
            if E.KILL == "barrier":
                ctx.barrier()
                if E.is_victim(rec.identity):
                    E.kill_now()
            elif E.is_victim(rec.identity):
                E.kill_inside_backward(model.module if hasattr(model, "module") else model)

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
            fabric.backward(loss)
            return loss

        strategy.step(opt, closure)
        rec.line(f"commit {step}")
    for event in strategy.membership_changes:
        rec.line(f"lost {event['committed_before'].get('train', 0)}")
    padded = stream.index_sampler._c.info().padded
    try:
        check_parameters_equal(ctx, model.parameters(), 0)
        same = "replicas-identical"
    except Exception:
        same = "replicas-differ"
    summary = stream.reports[-1].summary if stream.reports else "no audit"
    rec.line(f"done {padded} {same} {summary}")
    rec.close()
    strategy.close()


if __name__ == "__main__":
    main()
