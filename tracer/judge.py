"""The acceptance rules of a trace (SPEC §6, App. D.4): scan counters in, :class:`Verdict` out.

A run's trace is accepted only if the END record is present, sequence numbers have no gap, the
dropped count is 0 and the write-error count is 0. Workload completion never substitutes for any
of these. Because a damaged file must never pass, the verdict also refuses checksum or structure
errors, a torn tail, bytes after END, and a record count that disagrees with END.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tracer.errors import TraceError

VERDICT_KEYS = ("accepted", "records", "end_present", "gaps", "dropped", "write_errors",
                "checksum_errors", "recovered_records", "reason")


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    records: int  # END's count of event records; without END, highest seq seen + 1
    end_present: bool
    gaps: int  # sequence discontinuities: missing or duplicated records/packets
    dropped: int  # records the writer discarded (END's counter, else the last packet's)
    write_errors: int  # failed packet writes (END's counter, else the last packet's)
    checksum_errors: int  # damaged regions (CRC mismatch, bad packet header, malformed record)
    recovered_records: int  # event records read back from intact packets (END excluded)
    reason: str  # "accepted" or "not accepted: <every problem found>"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ScanCounters:
    """What a reader saw; :func:`judge` turns it into a :class:`Verdict`."""

    recovered_records: int = 0
    max_seq: int = -1
    end_present: bool = False
    end_records: int = 0
    end_dropped: int = 0
    end_write_errors: int = 0
    packet_dropped: int = 0  # highest discarded-record snapshot seen in a packet header
    packet_write_errors: int = 0
    gaps: int = 0
    missing_records: int = 0
    duplicate_packets: int = 0
    checksum_errors: int = 0
    malformed_packets: int = 0
    torn_tail_bytes: int = 0
    bytes_after_end: int = 0
    unresolved_strings: int = 0


def judge(c: ScanCounters) -> Verdict:
    if c.end_present:
        records, dropped, write_errors = c.end_records, c.end_dropped, c.end_write_errors
    else:
        records = c.max_seq + 1
        dropped, write_errors = c.packet_dropped, c.packet_write_errors
    gaps = c.gaps
    problems: list[str] = []
    if not c.end_present:
        torn = f" (torn tail: {c.torn_tail_bytes} B)" if c.torn_tail_bytes else ""
        problems.append(f"END missing{torn}")
    if gaps:
        detail = []
        if c.missing_records:
            detail.append(f"{c.missing_records} records missing")
        if c.duplicate_packets:
            detail.append(f"{c.duplicate_packets} duplicated packets")
        problems.append(f"{gaps} sequence gaps" + (f" ({', '.join(detail)})" if detail else ""))
    if c.end_present and not gaps and c.recovered_records != records:
        problems.append(f"{c.recovered_records} records read but END says {records}")
        gaps += 1
    if dropped:
        problems.append(f"{dropped} records dropped")
    if write_errors:
        problems.append(f"{write_errors} write errors")
    checksum_errors = c.checksum_errors + c.malformed_packets
    if c.checksum_errors:
        problems.append(f"{c.checksum_errors} damaged regions (checksum or packet header)")
    if c.malformed_packets:
        problems.append(f"{c.malformed_packets} malformed packets")
    if c.bytes_after_end:
        problems.append(f"{c.bytes_after_end} B after END")
    if c.unresolved_strings:
        problems.append(f"{c.unresolved_strings} request ids lost with their dictionary record")
    accepted = not problems
    reason = "accepted" if accepted else "not accepted: " + "; ".join(problems)
    return Verdict(accepted, records, c.end_present, gaps, dropped, write_errors,
                   checksum_errors, c.recovered_records, reason)


__all__ = ["Verdict", "ScanCounters", "judge", "VERDICT_KEYS", "TraceError"]
