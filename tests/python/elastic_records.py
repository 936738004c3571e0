"""The elastic tests' own count of what a run trained, from the record files its
trainers write (the C trainer tests/elastic/elastic_trainer.c and the Python
ones in tests/python/scripts/ write the same lines):

    <dir>/rec-a<attempt>-p<identity>.txt
      resumed <steps>          loaded the checkpoint (epoch steps committed)
      drawn <step> <idx>...    drew the batch of epoch step <step>
      commit <step>            committed it
      adopted <step>           committed on its behalf at a re-formation
      lost <committed>         learned of a lost rank having committed that many
      done <padded> <text>     finished the epoch; the declared padding; the audit line

What was trained: in place, every committed (or adopted) batch, and a lost
rank's batch of the step in flight when a survivor had completed that step (its
allreduce was complete); after a restart, every batch drawn before the
checkpoint's step in the first attempt (the ranks went in lockstep), and every
committed batch of the next. Independent of the audit: the audit must agree.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List


class Outcome:
    def __init__(self, counts: List[int], padded: int, prior_padding: int, done: Dict[int, str]) -> None:
        self.counts = counts
        self.padded = padded
        self.prior_padding = prior_padding
        self.done = done

    @property
    def skips(self) -> int:
        return sum(1 for c in self.counts if c == 0)

    @property
    def repeats(self) -> int:
        return sum(c - 1 for c in self.counts if c > 1)

    def check(self, what: str) -> None:
        allowed = self.padded + self.prior_padding
        assert self.skips == 0 and self.repeats == allowed, (
            f"{what}: {self.skips} samples never trained, {self.repeats} repeated deliveries"
            f" (declared padding {self.padded}, padding before the restart {self.prior_padding})")
        assert self.done, f"{what}: no rank finished the epoch"
        for ident, line in self.done.items():
            assert "replicas-identical" in line, f"{what}: process {ident}: {line}"
            assert "PASS" in line, f"{what}: process {ident}'s audit: {line}"


def _parse(path: Path) -> list:
    events = []
    for line in path.read_text().splitlines():
        parts = line.split(" ", 2) if line.startswith("done ") else line.split()
        if parts:
            events.append(parts)
    return events


def count(directory: Path, n: int) -> Outcome:
    files = {}
    for p in directory.glob("rec-a*-p*.txt"):
        m = re.match(r"rec-a(\d+)-p(\d+)\.txt$", p.name)
        if m:
            files[(int(m.group(1)), int(m.group(2)))] = _parse(p)
    attempts = sorted({a for a, _ in files})
    counts = [0] * n
    done: Dict[int, str] = {}
    padded = 0
    prior_padding = 0
    resumed = None
    for (a, ident), events in files.items():
        for e in events:
            if e[0] == "resumed":
                resumed = int(e[1])
    for a in attempts:
        last = a == attempts[-1]
        per = {ident: ev for (aa, ident), ev in files.items() if aa == a}
        if not last and resumed is None:
            continue  # restarted without a checkpoint: nothing of it was kept
        if not last:
            # the first attempt, cut by the restart: what the checkpoint committed
            before = [0] * n
            for ident, events in per.items():
                for e in events:
                    if e[0] == "drawn" and int(e[1]) < resumed:
                        for i in e[2:]:
                            before[int(i)] += 1
            prior_padding += sum(c - 1 for c in before if c > 1)
            counts = [x + y for x, y in zip(counts, before)]
            continue
        lost_at = [int(e[1]) for ev in per.values() for e in ev if e[0] == "lost"]
        for ident, events in per.items():
            drawn: Dict[int, list] = {}
            trained = set()
            finished = False
            for e in events:
                if e[0] == "drawn":
                    drawn[int(e[1])] = [int(i) for i in e[2:]]
                elif e[0] in ("commit", "adopted"):
                    trained.add(int(e[1]))
                elif e[0] == "done":
                    finished = True
                    padded = max(padded, int(e[1]))
                    done[ident] = e[2] if len(e) > 2 else ""
            if not finished and drawn and lost_at:
                # a lost process: its batch in flight counts when a survivor
                # completed that step
                step = max(drawn)
                if step not in trained and max(lost_at) > step:
                    trained.add(step)
            for step in trained:
                for i in drawn.get(step, []):
                    counts[i] += 1
    return Outcome(counts, padded, prior_padding, done)
