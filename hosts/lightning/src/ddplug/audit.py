"""The per-epoch data-split audit (``ddplug_audit_*``): what every rank consumed,
checked together — steps and samples per rank, union coverage, repeats — with a
diagnosis ("no partitioning", "double partitioning", "uneven batches", ...).

A plugin-owned stream's context-bound sampler records by itself; for a user- or
framework-owned stream the host records every step (:meth:`Audit.record`).
:meth:`Audit.finish` is collective: every rank that began the audit finishes it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from . import _structs as S
from ._api import F
from .context import Context
from .errors import AuditFailed, make


@dataclass
class Report:
    """One finished audit, identical on every rank."""

    stream: str
    epoch: int
    verdict: str  # "PASS", "SKIPPED", "NO_PARTITION", ...
    violations: list
    summary: str
    text: str
    num_samples: int
    covered: int
    deliveries: int
    repeats: int
    exact: bool
    full: bool
    world_size: int
    steps: list = field(default_factory=list)  # per rank (first 64 ranks)
    samples: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.verdict in ("PASS", "SKIPPED")

    @property
    def skipped(self) -> bool:
        return self.verdict == "SKIPPED"

    def metrics(self, prefix: str = "ddplug/audit") -> dict:
        """Numbers for a logger, keyed ``<prefix>/<stream>/<name>``."""
        p = f"{prefix}/{self.stream}"
        out = {
            f"{p}/passed": float(self.passed),
            f"{p}/covered": float(self.covered),
            f"{p}/num_samples": float(self.num_samples),
            f"{p}/deliveries": float(self.deliveries),
            f"{p}/repeats": float(self.repeats),
        }
        if self.steps:
            out[f"{p}/steps_min"] = float(min(self.steps))
            out[f"{p}/steps_max"] = float(max(self.steps))
        return out


def verdict_name(code: int) -> str:
    raw = F.ddplug_audit_verdict_name(code)
    return raw.decode() if raw else f"verdict#{code}"


def _report(r: S.AuditReport) -> Report:
    n = max(0, min(r.ranks_listed, S.AUDIT_MAX_RANKS))
    violations = [verdict_name(v) for v in range(32) if r.violations & (1 << v)]
    return Report(
        stream=S.text(r.stream),
        epoch=int(r.epoch),
        verdict=verdict_name(r.verdict),
        violations=violations,
        summary=S.text(r.summary),
        text=S.text(r.text),
        num_samples=int(r.num_samples),
        covered=int(r.covered),
        deliveries=int(r.deliveries),
        repeats=int(r.repeats),
        exact=r.exact == 1,
        full=r.full == 1,
        world_size=int(r.world_size),
        steps=[int(r.steps[i]) for i in range(n)],
        samples=[int(r.samples[i]) for i in range(n)],
    )


class Audit:
    """The audit of one epoch of one stream (``ddplug_audit_begin``)."""

    def __init__(
        self,
        ctx: Context,
        stream: str,
        num_samples: int,
        epoch: int,
        *,
        shuffle: bool = False,
        allowed_padding: int = 0,
        allowed_missing: int = 0,
    ) -> None:
        self._ctx = ctx
        self.stream = stream
        self.epoch = int(epoch)
        opts = S.new(
            S.AuditOptions,
            shuffle=int(bool(shuffle)),
            allowed_padding=int(max(0, allowed_padding)),
            allowed_missing=int(max(0, allowed_missing)),
        )
        out = ctypes.c_void_p()
        ctx._check(
            F.ddplug_audit_begin(ctx.handle, stream.encode(), int(num_samples), self.epoch,
                                 ctypes.byref(opts), ctypes.byref(out)),
            f"audit begin ({stream}, epoch {epoch})",
        )
        self._h: Optional[ctypes.c_void_p] = out
        self.report: Optional[Report] = None

    def record(self, indices: Sequence[int]) -> None:
        """Record one step that consumed ``indices`` (local, O(n))."""
        arr = np.ascontiguousarray(np.asarray(indices, dtype=np.int64).reshape(-1))
        self._ctx._check(
            F.ddplug_audit_record(self._h, arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), arr.size),
            f"audit record ({self.stream})",
        )

    def finish(self, timeout_s: Optional[float] = None) -> Report:
        """Collective. Returns the report; raises :class:`~ddplug.errors.AuditFailed`
        (with the report attached as ``.report``) when a violation fails the run."""
        rep = S.new(S.AuditReport)
        ms = -1 if timeout_s is None else int(timeout_s * 1000)
        with self._ctx.lock:  # the audit's allreduces run on the context's collectives
            st = F.ddplug_audit_finish(self._h, ctypes.byref(rep), ms)
        report = _report(rep)
        self.report = report
        self.free()
        if st != 0:
            err = make(st, detail=report.summary if report.summary else None,
                       where=f"rank {self._ctx.rank}: audit of stream '{self.stream}' epoch {self.epoch}")
            if isinstance(err, AuditFailed):
                err.report = report  # type: ignore[attr-defined]
            raise err
        return report

    def free(self) -> None:
        h, self._h = self._h, None
        if h:
            F.ddplug_audit_free(h)

    @property
    def open(self) -> bool:
        return bool(self._h)
