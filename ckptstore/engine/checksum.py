"""Streaming CRC32C checksums (hardware-accelerated via the ``crc32c`` package).

``crc32c_combine`` is written here because no well-kept Python package exposes it: it
lets parts checksummed in parallel (or items checksummed one by one) be folded into the
checksum of their concatenation without reading the bytes twice. It is zlib's
``crc32_combine`` algorithm (GF(2) matrix powers), O(log n) in the length, each matrix
applied through four 256-entry tables (built on first use) instead of bit by bit: a save
combines a CRC per item and per part, on the save thread, holding the GIL.
"""

from __future__ import annotations

import crc32c as _crc32c

__all__ = ["crc32c", "crc32c_combine", "format_crc", "parse_crc", "Crc32c"]

_POLY = 0x82F63B78  # CRC32C (Castagnoli), reflected


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value`` (the CRC of the bytes before it)."""
    return int(_crc32c.crc32c(data, value))


def _gf2_times(mat: list[int], vec: int) -> int:
    out = 0
    i = 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def _zero_byte_operators() -> list[list[int]]:
    """Operators that append 2**k zero bytes to a CRC, for k = 0..63 (computed once)."""
    op = [_POLY] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):  # 2, 4, 8 zero bits = one zero byte
        op = _gf2_square(op)
    ops = [op]
    for _ in range(63):
        ops.append(_gf2_square(ops[-1]))
    return ops


_ZERO_OPS = _zero_byte_operators()
_TABLES: dict[int, tuple[list[int], list[int], list[int], list[int]]] = {}


def _byte_table(columns: list[int]) -> list[int]:
    """The operator's images of the 256 values of one byte (its 8 columns)."""
    table = [0] * 256
    for b in range(1, 256):
        low = b & -b
        table[b] = table[b ^ low] ^ columns[low.bit_length() - 1]
    return table


def _tables(k: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """``_ZERO_OPS[k]`` as four byte tables (built once; a race builds them twice)."""
    tables = _TABLES.get(k)
    if tables is None:
        op = _ZERO_OPS[k]
        t0, t1, t2, t3 = (_byte_table(op[8 * j : 8 * j + 8]) for j in range(4))
        tables = _TABLES[k] = (t0, t1, t2, t3)
    return tables


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32C of A+B given crc(A), crc(B) and len(B)."""
    k = 0
    while len2 > 0:
        if len2 & 1:
            t0, t1, t2, t3 = _tables(k)
            crc1 = t0[crc1 & 255] ^ t1[crc1 >> 8 & 255] ^ t2[crc1 >> 16 & 255] ^ t3[crc1 >> 24]
        len2 >>= 1
        k += 1
    return crc1 ^ crc2


def format_crc(value: int) -> str:
    """``value`` as the 8 lowercase hex digits manifests and markers store."""
    return f"{value:08x}"


def parse_crc(text: str) -> int:
    """The CRC that ``text`` (hex digits) spells; raises ``ValueError`` if it is not hex."""
    return int(text, 16)


class Crc32c:
    """A running CRC32C over appended bytes, each given raw or as its pre-computed CRC."""

    __slots__ = ("value", "length")

    def __init__(self) -> None:
        self.value = 0
        self.length = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data``'s bytes."""
        self.value = crc32c(data, self.value)
        self.length += len(data)

    def extend(self, crc: int, length: int) -> None:
        """Append ``length`` bytes whose CRC is already known."""
        self.value = crc32c_combine(self.value, crc, length)
        self.length += length

    def hexdigest(self) -> str:
        """The CRC so far, formatted as ``format_crc`` does."""
        return format_crc(self.value)
