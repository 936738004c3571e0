"""A plain-PyTorch loop (ddplug.torch) for the elastic tests: one epoch of an
indexed dataset through dt.prepare_model and dt.step, a rank killed at a chosen
step (elastic_common.py), and the record file the tests count from. Restart mode
checkpoints dt.state_dict() with the model after every step (rank 0) and loads it
in a restarted attempt. Launched with ``ddplug run``.
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import DataLoader

import elastic_common as E
import ddplug.torch as dt
from ddplug.nn.gradsync import check_parameters_equal


def main() -> None:
    ctx = dt.init(E.config())
    rec = E.Record(ctx.membership()["identity"])
    loader = dt.prepare_dataloader(DataLoader(E.Indexed(E.N), batch_size=E.B, shuffle=True))
    model = dt.prepare_model(E.model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = os.path.join(E.DIR, "ckpt.pt")
    if E.MODE == "restart" and E.ATTEMPT > 0 and os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        dt.load_state_dict(state["ddplug"])
        rec.line(f"resumed {loader.batch_sampler.committed_in_epoch}")
    stream = loader.batch_sampler
    killed = False
    for batch in loader:
        idx, x, y = batch
        step = stream.committed_in_epoch  # the epoch step this batch is
        rec.draw(step, idx.tolist())
        if E.ATTEMPT == 0 and step == E.STEP and not killed:
            killed = True
            if E.KILL == "barrier":
                ctx.barrier()
                if E.is_victim(rec.identity):
                    E.kill_now()
            elif E.is_victim(rec.identity):
                E.kill_inside_backward(model)

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
            loss.backward()
            return loss

        dt.step(opt, closure)
        rec.line(f"commit {step}")
        if E.MODE == "restart" and ctx.rank == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "ddplug": dt.state_dict()}, tmp)
            os.replace(tmp, ckpt)
    for event in dt.membership_changes():
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
    dt.shutdown()


if __name__ == "__main__":
    main()
