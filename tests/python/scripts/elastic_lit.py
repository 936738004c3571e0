"""A Lightning Trainer run for the elastic tests: one epoch of an indexed dataset
with the ddplug strategy, a rank killed at a chosen step (elastic_common.py says
how), and the record file the tests count from.

    inplace:  python elastic_lit.py --devices N    (Lightning's own launcher)
    restart:  ddplug run -n N --max-restarts 1 --shrink-on-restart -- python elastic_lit.py
              (checkpoints every step; a restart resumes with ckpt_path="last")
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils.data import DataLoader

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

import elastic_common as E
import ddplug.lightning
from ddplug.nn.gradsync import check_parameters_equal


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = E.model()
        self.rec = None
        self.killed = False

    def on_train_start(self) -> None:
        ctx = self.trainer.strategy.context
        self.rec = E.Record(ctx.membership()["identity"])
        train = self.trainer.strategy.streams["train"]
        if E.ATTEMPT > 0 and E.MODE == "restart":
            self.rec.line(f"resumed {train.committed_in_epoch}")
        if E.KILL == "inside" and E.ATTEMPT == 0 and E.is_victim(self.rec.identity):
            self.arm = True

    def training_step(self, batch, batch_idx):
        idx, x, y = batch
        self.rec.draw(batch_idx, idx.tolist())
        if E.ATTEMPT == 0 and batch_idx == E.STEP and not self.killed:
            self.killed = True
            if E.KILL == "barrier":
                self.trainer.strategy.context.barrier()
                if E.is_victim(self.rec.identity):
                    E.kill_now()
            elif E.is_victim(self.rec.identity):
                E.kill_inside_backward(self.net)
        return torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.rec.line(f"commit {batch_idx}")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self):
        return DataLoader(E.Indexed(E.N), batch_size=E.B, shuffle=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    args = p.parse_args()
    strategy = ddplug.lightning.DdplugStrategy(config=E.config())
    callbacks = []
    ckpt_dir = os.path.join(E.DIR, "ckpt")
    if E.MODE == "restart":
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=1, save_last=True,
                                         save_top_k=1))
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy, max_epochs=1,
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks, enable_checkpointing=E.MODE == "restart",
                         num_sanity_val_steps=0)
    module = Module()
    resume = "last" if E.MODE == "restart" and E.ATTEMPT > 0 and os.path.exists(
        os.path.join(ckpt_dir, "last.ckpt")) else None
    trainer.fit(module, ckpt_path=resume)
    ctx = strategy.context
    for event in strategy.membership_changes:
        module.rec.line(f"lost {event['committed_before'].get('train', 0)}")
    train = strategy.streams["train"]
    padded = train.index_sampler._c.info().padded
    try:
        check_parameters_equal(ctx, module.parameters(), 0)
        same = "replicas-identical"
    except Exception:
        same = "replicas-differ"
    summary = train.reports[-1].summary if train.reports else "no audit"
    module.rec.line(f"done {padded} {same} {summary}")
    module.rec.close()
    strategy.close()


if __name__ == "__main__":
    main()
