"""The per-epoch data-split audit (``ddplug_audit_*``): what every rank consumed,
checked together — steps and samples per rank, union coverage, repeats — with a
diagnosis naming every problem present ("missing samples: ... e.g. sample 501,
502", "repeated samples: ...", "uneven batches: ...", ...).

A plugin-owned stream's context-bound sampler records by itself; for a user- or
framework-owned stream the host records every step (:meth:`Audit.record`, or
:meth:`Audit.record_ids` for samples identified by id). :meth:`Audit.finish` is
collective: every rank that began the audit finishes it.
"""

from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from .._c import _capi as S
from .._c._capi import F
from ..context import Context
from ..errors import AuditFailed, make

# ddplug_audit_verdict values of the violations with example indices.
_MISSING, _OVERLAP = 6, 7
_EXAMPLES = 8


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
    missing: int = 0
    evaluation: bool = False
    steps: list = field(default_factory=list)  # per rank, every rank
    samples: list = field(default_factory=list)
    missing_examples: list = field(default_factory=list)  # never delivered (exact mode)
    repeated_examples: list = field(default_factory=list)  # delivered more than once
    repeated_keys: list = field(default_factory=list)  # by id: their keys, where this rank knows them

    @property
    def passed(self) -> bool:
        return self.verdict in ("PASS", "SKIPPED")

    @property
    def skipped(self) -> bool:
        return self.verdict == "SKIPPED"

    @property
    def diagnoses(self) -> list:
        """One line per problem found (the text's "diagnosis:" lines)."""
        head = "  diagnosis: "
        return [line[len(head):] for line in self.text.splitlines() if line.startswith(head)]

    def metrics(self, prefix: str = "ddplug/audit") -> dict:
        """Numbers for a logger, keyed ``<prefix>/<stream>/<name>``."""
        p = f"{prefix}/{self.stream}"
        out = {
            f"{p}/passed": float(self.passed),
            f"{p}/covered": float(self.covered),
            f"{p}/num_samples": float(self.num_samples),
            f"{p}/deliveries": float(self.deliveries),
            f"{p}/repeats": float(self.repeats),
            f"{p}/missing": float(self.missing),
        }
        if self.steps:
            out[f"{p}/steps_min"] = float(min(self.steps))
            out[f"{p}/steps_max"] = float(max(self.steps))
        return out


def verdict_name(code: int) -> str:
    raw = F.ddplug_audit_verdict_name(code)
    return raw.decode() if raw else f"verdict#{code}"


def _examples(h: ctypes.c_void_p, verdict: int) -> list:
    buf = (ctypes.c_int64 * _EXAMPLES)()
    n = ctypes.c_uint64(0)
    if F.ddplug_audit_examples(h, verdict, buf, _EXAMPLES, ctypes.byref(n)) != 0:
        return []
    return [int(buf[i]) for i in range(n.value)]


def _report(h: ctypes.c_void_p, r: S.AuditReport, rank: int) -> Report:
    violations = [verdict_name(v) for v in range(32) if r.violations & (1 << v)]
    steps, samples = [], []
    st, sa = ctypes.c_uint64(0), ctypes.c_uint64(0)
    for k in range(int(r.world_size)):  # every rank's counts (a skipped epoch: none)
        if F.ddplug_audit_rank_counts(h, k, ctypes.byref(st), ctypes.byref(sa)) != 0:
            steps, samples = [], []
            break
        steps.append(int(st.value))
        samples.append(int(sa.value))
    raw = F.ddplug_audit_text(h)
    return Report(
        stream=S.text(r.stream),
        epoch=int(r.epoch),
        verdict=verdict_name(r.verdict),
        violations=violations,
        summary=S.text(r.summary),
        text=raw.decode("utf-8", "replace") if raw else "",
        num_samples=int(r.num_samples),
        covered=int(r.covered),
        deliveries=int(r.deliveries),
        repeats=int(r.repeats),
        exact=r.exact == 1,
        full=r.full == 1,
        world_size=int(r.world_size),
        missing=int(r.missing),
        evaluation=bool(r.evaluation),
        steps=steps,
        samples=samples,
        missing_examples=_examples(h, _MISSING),
        repeated_examples=_examples(h, _OVERLAP),
    )


def sample_id(key: Any) -> int:
    """A sample's 64-bit id for :meth:`Audit.record_ids`: an int as is (mod
    2^64), anything else by a stable hash of its ``str`` (blake2b: the same in
    every process, unlike Python's ``hash``)."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return int(key) & 0xFFFFFFFFFFFFFFFF
    if isinstance(key, bytes):
        data = key
    else:
        data = str(key).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class Audit:
    """The audit of one epoch of one stream (``ddplug_audit_begin``).

    Args:
        shuffle: the order must change between epochs.
        evaluation: an evaluation stream: every sample exactly once, per-rank
            steps may differ, nothing may be declared.
        allowed_padding / allowed_missing: declared repeats and left-out
            samples, all ranks together.
        local_dropped: samples this rank's batching drops (a drop_last
            remainder), summed over the ranks.
        by_id: samples are identified by id (:meth:`record_ids`); num_samples
            is then the expected number of ids (0: unknown).
        steps_only: the ranks' indices are not in one index space: check steps
            and order only.
    """

    def __init__(
        self,
        ctx: Context,
        stream: str,
        num_samples: int,
        epoch: int,
        *,
        shuffle: bool = False,
        evaluation: bool = False,
        allowed_padding: int = 0,
        allowed_missing: int = 0,
        local_dropped: int = 0,
        by_id: bool = False,
        steps_only: bool = False,
    ) -> None:
        self._ctx = ctx
        self.stream = stream
        self.epoch = int(epoch)
        opts = S.new(
            S.AuditOptions,
            shuffle=int(bool(shuffle)),
            evaluation=int(bool(evaluation)),
            allowed_padding=int(max(0, allowed_padding)),
            allowed_missing=int(max(0, allowed_missing)),
            local_dropped=int(max(0, local_dropped)),
            by_id=int(bool(by_id)),
            steps_only=int(bool(steps_only)),
        )
        out = ctypes.c_void_p()
        ctx.check(
            F.ddplug_audit_begin(ctx.handle, stream.encode(), int(num_samples), self.epoch,
                                 ctypes.byref(opts), ctypes.byref(out)),
            f"audit begin ({stream}, epoch {epoch})",
        )
        self._h: Optional[ctypes.c_void_p] = out
        self.report: Optional[Report] = None

    def record(self, indices: Sequence[int]) -> None:
        """Record one step that consumed ``indices`` (local, O(n))."""
        arr = np.ascontiguousarray(np.asarray(indices, dtype=np.int64).reshape(-1))
        self._ctx.check(
            F.ddplug_audit_record(self._h, arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), arr.size),
            f"audit record ({self.stream})",
        )

    def record_ids(self, keys: Iterable[Any]) -> None:
        """Record one step that consumed the samples with these ids (ints or keys,
        see :func:`sample_id`)."""
        arr = np.ascontiguousarray(np.fromiter((sample_id(k) for k in keys), dtype=np.uint64))
        self._ctx.check(
            F.ddplug_audit_record_ids(self._h, arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), arr.size),
            f"audit record ids ({self.stream})",
        )

    def declare_dropped(self, indices: Sequence[int]) -> None:
        """Declare the indices this epoch leaves out on purpose (the same set on
        every rank)."""
        arr = np.ascontiguousarray(np.asarray(indices, dtype=np.int64).reshape(-1))
        self._ctx.check(
            F.ddplug_audit_declare_dropped(self._h, arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), arr.size),
            f"audit of stream '{self.stream}': declared dropped samples",
        )

    def finish(self, timeout_s: Optional[float] = None) -> Report:
        """Collective. Returns the report; raises :class:`~ddplug.errors.AuditFailed`
        (with the report attached as ``.report``) when a violation fails the run:
        its message is the summary and every diagnosis, once."""
        rep = S.new(S.AuditReport)
        ms = -1 if timeout_s is None else int(timeout_s * 1000)
        with self._ctx.lock:  # the audit's allreduces run on the context's collectives
            st = F.ddplug_audit_finish(self._h, ctypes.byref(rep), ms)
        report = _report(self._h, rep, self._ctx.rank) if st == 0 or rep.verdict else None
        if report is not None:
            self.report = report
        if st != 0:
            if report is not None and report.verdict not in ("UNSET", "PASS", "SKIPPED"):
                lines = [report.summary] + [f"  {d}" for d in report.diagnoses[1:]]
                err = make(st, detail="\n".join(lines), where=f"rank {self._ctx.rank}")
            else:  # the library's sentence names the stream and epoch already
                err = make(st, where=f"rank {self._ctx.rank}")
            self.free()
            if isinstance(err, AuditFailed) and report is not None:
                err.report = report  # type: ignore[attr-defined]
            raise err
        self.free()
        return report  # type: ignore[return-value]

    def free(self) -> None:
        h, self._h = self._h, None
        if h:
            F.ddplug_audit_free(h)

    @property
    def open(self) -> bool:
        return bool(self._h)
