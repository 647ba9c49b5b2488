import os

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.engine.checksum import Crc32c, crc32c, crc32c_combine


def test_known_vector() -> None:
    # RFC 3720 test vector: 32 bytes of zeros.
    assert crc32c(b"\x00" * 32) == 0x8A9136AA
    assert crc32c(b"123456789") == 0xE3069283


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.binary(max_size=3000))
def test_combine_equals_crc_of_concatenation(a: bytes, b: bytes) -> None:
    assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)


def test_running_crc_mixes_raw_and_precomputed_buffers() -> None:
    buffers = [os.urandom(n) for n in (0, 1, 17, 4096, 100_000)]
    running = Crc32c()
    for i, p in enumerate(buffers):
        if i % 2:
            running.extend(crc32c(p), len(p))
        else:
            running.update(p)
    assert running.value == crc32c(b"".join(buffers))
    assert running.length == sum(map(len, buffers))
